"""Full fidelity on a fat-tree with static ECMP: the time of one step, before and after, in one run.

    python benchmarks/fabric_speed.py [--repeat N] [--before TREE] [--every] [--over R]
                                      [--case example|405b-16k] [--batch B] [--seed S]

The case is ``examples/fabric-llama3-70b.yaml`` in ``full`` (Llama 3 70B on 1,024 H100, a
fat-tree of 8 spines under static ECMP; issue 26's target: at most 3 s on an idle 2-core
machine, from 8.8 s), or with ``--case 405b-16k`` Llama 3 405B on 16,384 H100 on the same
fabric (tp 8, pp 16, dp 128, 2,048 sequences; the target: at most 60 s). Each repeat runs,
interleaved so the machine's load falls alike on all: this tree's ``simulate``; with
``--every``, this tree simulating every GPU (``Engine(symmetry=False)``: no rank folded by
symmetry); with ``--before TREE``, ``simulate`` of the source tree at TREE (a checkout or ``git
worktree`` of an earlier commit), each tree then in a fresh process of its own. Prints each
one's median CPU and wall time with their spread (min-max), the ratio of each to this tree's,
its step time and how far it lies from TREE's (or every GPU's), and the closed-form estimate
of the same case. ``--over R`` oversubscribes the leaves R:1, ``--seed S`` sets the ECMP
hash's seed, ``--batch B`` the global batch (fewer micro-batches: a quicker check).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engine_speed  # a sibling script: benchmarks/ is on sys.path

import clustersim
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.yamlio import load_yaml_file

HERE = Path(__file__).resolve().parent.parent
EXAMPLE = HERE / "examples" / "fabric-llama3-70b.yaml"
# benchmarks/engine_speed.py's 16,384-GPU case, on the example's fabric
LLAMA3_405B_16K = {**engine_speed.LLAMA3_405B_16K, "name": "llama3-405b-16k-fat-tree"}
PACKAGES = ("simulator", "topologies", "validation", "reports")  # pyproject's package-dir

# Run in a fresh process against another tree: the editable install's finder is dropped so
# that the shim (TREE's folders laid out as one ``clustersim`` package) is imported instead.
CHILD = """
import json, sys, time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv[1])
import clustersim
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
s = build_scenario(json.loads(sys.argv[2]))
cpu, wall = time.process_time(), time.perf_counter()
r = simulate(s, "full")
print(json.dumps([r.step_time_s, time.process_time() - cpu, time.perf_counter() - wall,
                  clustersim.__file__]))
"""


def shim(tree: Path, into: Path) -> Path:
    """``into/clustersim``: TREE's ``clustersim`` files and its other top folders as
    subpackages, by symbolic links (pyproject.toml's ``package-dir``)."""
    package = into / "clustersim"
    package.mkdir()
    for path in (tree / "clustersim").iterdir():
        (package / path.name).symlink_to(path)
    for name in PACKAGES:
        (package / name).symlink_to(tree / name)
    return into


def raw_case(over: float, case: str = "example", batch: int | None = None,
             seed: int | None = None) -> dict:
    """The example (or the 16,384-GPU case on its fabric), leaves oversubscribed ``over``:1."""
    raw = load_yaml_file(EXAMPLE)
    if case == "405b-16k":
        raw = {**LLAMA3_405B_16K, "cluster": {**LLAMA3_405B_16K["cluster"],
                                              "inter_node": raw["cluster"]["inter_node"]}}
    raw["cluster"]["inter_node"]["oversubscription"] = over
    if seed is not None:
        raw["cluster"]["inter_node"]["ecmp_seed"] = seed
    if batch is not None:
        raw["training"]["global_batch"] = batch
    return raw


def time_here(raw: dict, every: bool) -> tuple[float, float, float]:
    """(step, CPU s, wall s) of this tree: ``simulate``, or every GPU simulated whole."""
    s = build_scenario(raw)
    cpu, wall = time.process_time(), time.perf_counter()
    if every:
        step = Engine(s, "full", symmetry=False).run().step_time_s
    else:
        step = clustersim.simulate(raw, fidelity="full").step_time_s
    return step, time.process_time() - cpu, time.perf_counter() - wall


def time_tree(raw: dict, root: Path) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), json.dumps(raw)],
                         capture_output=True, text=True, check=True).stdout
    step, cpu, wall, where = json.loads(out.strip().splitlines()[-1])
    assert str(root) in where, f"the child imported {where}, not the tree"
    return step, cpu, wall


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="an earlier source tree to time beside")
    parser.add_argument("--every", action="store_true", help="also simulate every GPU")
    parser.add_argument("--over", type=float, default=1.0, help="leaf oversubscription")
    parser.add_argument("--case", choices=("example", "405b-16k"), default="example")
    parser.add_argument("--batch", type=int, help="global batch (default: the case's)")
    parser.add_argument("--seed", type=int, help="the ECMP hash's seed")
    args = parser.parse_args()
    raw = raw_case(args.over, args.case, args.batch, args.seed)
    runs: dict[str, list[tuple[float, float, float]]] = {"this tree": []}
    if args.every:
        runs["this tree, every GPU"] = []
    if args.before:
        runs[f"before ({args.before})"] = []
    with tempfile.TemporaryDirectory() as tmp:
        roots = {}
        if args.before:  # both trees in fresh processes, alike
            for name, tree in (("this", HERE), ("before", args.before.resolve())):
                (Path(tmp) / name).mkdir()
                roots[name] = shim(tree, Path(tmp) / name)
        for _ in range(args.repeat):
            for label in runs:
                if label == "this tree":
                    runs[label].append(time_tree(raw, roots["this"]) if roots
                                       else time_here(raw, every=False))
                elif label.startswith("before"):
                    runs[label].append(time_tree(raw, roots["before"]))
                else:
                    runs[label].append(time_here(raw, every=True))
    report(runs, raw, args)
    return 0


def report(runs: dict, raw: dict, args: argparse.Namespace) -> None:
    """One line per variant: CPU and wall (median, min-max), ratio to this tree's median CPU,
    step time and its distance from the reference (the tree before, else every GPU)."""
    here_cpu = statistics.median(cpu for _, cpu, _ in runs["this tree"])
    reference = next((label for label in runs if label.startswith("before")),
                     "this tree, every GPU" if args.every else "this tree")
    ref_step = runs[reference][0][0]
    case = EXAMPLE.name if args.case == "example" else raw["name"]
    print(f"{case} --fidelity full, leaves {args.over:g}:1, global batch "
          f"{raw['training']['global_batch']}, {args.repeat} repeats, interleaved; "
          "median (min-max)")
    for label, values in runs.items():
        steps, cpus, walls = zip(*values, strict=True)
        ratio = statistics.median(cpus) / here_cpu
        print(f"  {label:<40} CPU {spread(list(cpus)):<22} wall {spread(list(walls)):<22} "
              f"x{ratio:5.2f}  step {steps[0]:.6f} s ({steps[0] / ref_step - 1:+.3%})")
    closed = estimate(build_scenario(raw)).step_time_s
    print(f"  closed-form estimate of the same case: {closed:.6f} s")


if __name__ == "__main__":
    sys.exit(main())
