"""From the best published run to the planner's best plan, one change at a time (issue 23).

    python3 benchmarks/plan_waterfall.py

GPT-3 175B on A100: Korthikanti et al. 2022 (Table 5) measured 51.4% MFU on 64 GPUs (tp 8, pp 8,
3 interleaved chunks, 64 micro-batches of one sequence, selective recomputation, no flash
attention). ``clustersim plan --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --seq-len
2048 --global-batch 1536`` promises more. Each row below changes one thing of the row above and
prints the engine's MFU and step breakdown, so what the model credits for each step of the
difference is visible, and which steps rest on features whose cost is uncertain
(docs/planner.md, "Caveats").
"""

from __future__ import annotations

import copy

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

PUBLISHED = {
    "model": {"preset": "gpt3-175b", "seq_len": 2048},
    "cluster": {"preset": "dgx-a100-80gb", "gpus": 64},
    "training": {"global_batch": 64, "micro_batch": 1, "precision": "bf16",
                 "flash_attention": False},
    "parallel": {"tp": 8, "pp": 8, "dp": 1, "schedule": "interleaved", "virtual_stages": 3,
                 "zero": 1, "sequence_parallel": True, "recompute": "selective"},
}
# (label, changes as {"section.field": value}), each applied on top of the rows before it.
STEPS = (
    ("Korthikanti et al. 2022, Table 5 (measured 51.4%)", {}),
    ("flash attention", {"training.flash_attention": True}),
    ("1,024 GPUs, global batch 1,536 (dp 16)",
     {"cluster.gpus": 1024, "training.global_batch": 1536, "parallel.dp": 16}),
    ("tp 4, dp 32, no recomputation", {"parallel.tp": 4, "parallel.dp": 32,
                                       "parallel.recompute": "none"}),
    ("DualPipeV (split backward)", {"parallel.schedule": "dualpipev",
                                    "parallel.virtual_stages": 2}),
)


def applied(base: dict, changes: dict) -> dict:
    """``base`` with each dotted field of ``changes`` set."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        section, name = dotted.split(".")
        out[section][name] = value
    return out


def main() -> int:
    raw = PUBLISHED
    print(f"{'step':52s} {'MFU':>6s} {'step s':>7s} {'compute':>8s} {'comm':>6s} {'bubble':>7s}")
    for label, changes in STEPS:
        raw = applied(raw, changes)
        r = simulate(build_scenario({"name": "waterfall", **raw}))
        b = r.breakdown
        print(f"{label:52s} {100 * r.mfu:5.1f}% {r.step_time_s:7.2f} "
              f"{b.compute / r.step_time_s:7.0%} {b.exposed_comm / r.step_time_s:6.0%} "
              f"{b.bubble / r.step_time_s:7.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
