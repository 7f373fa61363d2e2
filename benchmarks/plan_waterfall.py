"""From the best published run to the planner's best plan, one change at a time (issue 23).

    python3 benchmarks/plan_waterfall.py

GPT-3 175B on A100: Korthikanti et al. 2022 (Table 5) measured 51.4% MFU on 64 GPUs (tp 8, pp 8,
3 interleaved chunks, 64 micro-batches of one sequence, selective recomputation, no flash
attention). ``clustersim plan --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --seq-len
2048 --global-batch 1536`` promises more; its best split is ``PLAN`` below. Each row is a step of
``reports/records.py``'s walk from the record (``reports/published_records.yaml``) to the plan,
the walk ``plan`` prints under its table: the engine's MFU and step breakdown after each group
of settings changes, so what the model credits for each part of the difference is visible.
"""

from __future__ import annotations

from clustersim.reports.records import credits, record_for
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

PLAN = {
    "model": {"preset": "gpt3-175b", "seq_len": 2048},
    "cluster": {"preset": "dgx-a100-80gb", "gpus": 1024},
    "training": {"global_batch": 1536, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 4, "pp": 8, "dp": 32, "schedule": "interleaved", "virtual_stages": 4,
                 "zero": 1, "sequence_parallel": True, "tp_comm_overlap": True,
                 "recompute": "none"},
}


def main() -> int:
    plan = build_scenario(PLAN)
    record = record_for(plan)
    walk = credits(record, plan)
    width = max(len(c.change) for c in walk)
    print(f"{'step':{width}s} {'MFU':>6s} {'step s':>7s} {'compute':>8s} {'comm':>6s} "
          f"{'bubble':>7s}")
    for c in walk:
        print(f"{c.change:{width}s} {c.mfu:6.1%} {c.step_time_s:7.2f} "
              + " ".join(f"{share:{w}.0%}" for share, w in zip(c.shares, (8, 6, 7), strict=True)))
    assert walk[-1].mfu == simulate(plan).mfu  # the walk ends at the plan
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
