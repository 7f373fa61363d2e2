"""Accuracy against published runs: held-out comparisons first, fitted ones apart.

    python benchmarks/accuracy.py [--fidelity representative|analytic] [--markdown] [--worst N]
    python benchmarks/accuracy.py --write-readme      # regenerate the README's and docs' blocks
    python benchmarks/accuracy.py --check-readme      # exit 1 if they are stale

Held out (the headline): the development set (tests/data/published-dev.yaml, 3D-parallel runs
of vTrain, BLOOM and Korthikanti et al. 2022) per source, with its fit/OOM agreement and ranking;
the published tables of tests/data (heldout-*.yaml, the Megatron tables) with the shipped profile
of their GPU, and each Megatron table with the other GPU's profile. Fitted, apart: every
comparison with a profile whose ``fitted_on`` names that table or source — how well the fit went,
which says nothing about predictions (clustersim.validation.accuracy applies the rule).

The README's accuracy block and docs/accuracy.md's tables are this script's Markdown at the
default fidelity; tests/validation/test_accuracy.py fails when they are stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clustersim.validation import accuracy

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", default="representative",
                        choices=["representative", "analytic"])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--worst", type=int, default=accuracy.WORST_DEV_RUNS, metavar="N",
                        help="list the development set's N worst runs (default %(default)s)")
    blocks = parser.add_mutually_exclusive_group()
    blocks.add_argument("--write-readme", action="store_true",
                        help="rewrite the generated blocks of README.md and docs/accuracy.md")
    blocks.add_argument("--check-readme", action="store_true",
                        help="exit 1 if those blocks differ from what this script produces")
    args = parser.parse_args(argv)
    if (args.write_readme or args.check_readme) and args.fidelity != "representative":
        parser.error("the README's numbers are the engine's at the default fidelity: "
                     "--write-readme and --check-readme take no --fidelity")
    report = accuracy.collect(DATA, args.fidelity)
    if args.write_readme:
        changed = accuracy.write_blocks(report, ROOT)
        print("\n".join(f"wrote {p.relative_to(ROOT)}" for p in changed) or "up to date")
        return 0
    if args.check_readme:
        stale = accuracy.stale_files(report, ROOT)
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python3 benchmarks/accuracy.py "
                  f"--write-readme", file=sys.stderr)
        return 1 if stale else 0
    print(accuracy.summary(report, args.markdown))
    print(accuracy.details(report, args.markdown, args.worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
