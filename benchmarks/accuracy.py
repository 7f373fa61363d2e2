"""Accuracy against published training throughput: held-out rows first, fitted rows apart.

    python benchmarks/accuracy.py [--fidelity representative|analytic] [--markdown]

Held out: every published table compared under a profile that was *not* fitted on it — the
shipped A100 profile (fitted on Narayanan et al. 2021) predicting the Megatron-Core H100 table on
H100 hardware, the shipped H100 profile (fitted on Megatron-Core) predicting the Narayanan A100
table on A100 hardware, and the shipped profiles on every ``tests/data/heldout-*.yaml`` case.
Fitted: each shipped profile against the table it was fitted on — how well the fit went, which
says nothing about predictions. The held-out mean and worst are the headline.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from clustersim.simulator.analytic import estimate
from clustersim.simulator.engine import simulate
from clustersim.topologies.profile import profile_for_gpu
from clustersim.validation import published as pub

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
# The GPU whose shipped profile was fitted on each table; the other one predicts it held out.
FITTED_GPU = {"megatron2021": "a100-80gb", "megatron-core-h100": "h100-sxm"}
TRANSFER = {"megatron2021": "h100-sxm", "megatron-core-h100": "a100-80gb"}


def predictor(fidelity: str) -> pub.Predict:
    if fidelity == "analytic":
        return lambda s, profile: estimate(s, profile)
    return lambda s, profile: simulate(s, fidelity, profile)


def held_out(predict: pub.Predict) -> list[tuple[str, list[pub.Row]]]:
    groups = []
    for table, gpu in TRANSFER.items():
        cases = pub.load_table(DATA / f"{table}.yaml")
        groups.append((f"{table} predicted with the {gpu} profile (fitted elsewhere)",
                       pub.held_out_rows(cases, profile_for_gpu(gpu), predict)))
    for path in sorted(DATA.glob("heldout-*.yaml")):
        groups.append((f"{path.stem} with the shipped profiles",
                       pub.held_out_rows(pub.load_table(path), None, predict)))
    return groups


def fitted(predict: pub.Predict) -> list[tuple[str, list[pub.Row]]]:
    return [(f"{table} with the {gpu} profile fitted on it (fit quality, not validation)",
             pub.predict_rows(pub.load_table(DATA / f"{table}.yaml"), profile_for_gpu(gpu),
                              predict))
            for table, gpu in FITTED_GPU.items()]


def markdown(title: str, rows: list[pub.Row]) -> str:
    lines = [f"**{title}**", "", "| case | metric | predicted | published | error |",
             "| --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        scale = 100 if row.case.metric in ("mfu", "hfu") else 1
        lines.append(f"| {row.case.id} | {row.case.metric} | {row.predicted * scale:.1f} | "
                     f"{row.case.published * scale:.1f} | {100 * row.error:+.1f}% |")
    mean, worst = pub.summary(rows)
    lines += ["", f"mean |error| {100 * mean:.1f}%, worst {100 * worst:.1f}%", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", default="representative",
                        choices=["representative", "analytic"])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    predict = predictor(args.fidelity)
    render = markdown if args.markdown else pub.format_rows
    every_held_out: list[pub.Row] = []
    print(f"# Held out ({args.fidelity})\n")
    for title, rows in held_out(predict):
        every_held_out += rows
        print(render(title, rows) + "\n")
    mean, worst = pub.summary(every_held_out)
    print(f"HELD OUT, all rows: mean |error| {100 * mean:.1f}%, worst {100 * worst:.1f}% "
          f"over {len(every_held_out)} published runs\n")
    print(f"# Fitted, apart ({args.fidelity})\n")
    for title, rows in fitted(predict):
        print(render(title, rows) + "\n")


if __name__ == "__main__":
    main()
