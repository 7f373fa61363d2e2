"""DeepSeek-V3's pre-training on 2,048 H800 against its report's GPU hours, as
``examples/deepseek-v3-h800.yaml`` writes it and with each of its choices taken back (issue 23;
docs/presets.md, "DeepSeek-V3 on 2048 H800 against its report").

    python3 benchmarks/deepseek_h800_report.py

The report's figure (arXiv 2412.19437, sec. 1 and Table 1: 2,664K H800 GPU hours for 14.8T
tokens) is 180K GPU hours per trillion tokens. A step of the example trains 15,360 sequences
of 4,096 tokens; a trillion tokens is that many steps times the step time, times 2,048 GPUs.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import apply_values, build_scenario

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deepseek-v3-h800.yaml"
REPORTED_K = 180  # thousand H800 GPU hours per trillion tokens
VARIANTS = [
    ("as the example writes it", {}),
    ("Megatron-Core's pairwise all-to-all", {"parallel.moe_dispatcher": "alltoall"}),
    ("DeepEP, routing free of the node cap",
     {"model.expert_groups": None, "model.expert_groups_per_token": None}),
    ("without the multi-token prediction module", {"model.mtp_layers": 0}),
    ("layers spread evenly over the chunks", {"parallel.stage_layers": None}),
]


def gpu_hours_k(step_s: float, s) -> float:
    """Thousand GPU hours per trillion tokens at ``step_s`` seconds a step of ``s``."""
    tokens = s.training.global_batch * s.model.seq_len
    return 1e12 / tokens * step_s * s.cluster.gpus / 3600 / 1e3


def main() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    print(f"DeepSeek-V3 on 2,048 H800, the report's {REPORTED_K}K GPU hours per trillion tokens")
    print(f"{'variant':44s} {'step s':>8s} {'GPU hours':>10s} {'error':>7s} {'peak GiB':>9s}")
    for label, change in VARIANTS:
        s = build_scenario(apply_values(raw, change))
        r = simulate(s)
        hours = gpu_hours_k(r.step_time_s, s)
        print(f"{label:44s} {r.step_time_s:8.3f} {hours:9.0f}K {hours / REPORTED_K - 1:+7.1%} "
              f"{r.peak_bytes / 2**30:9.1f}")


if __name__ == "__main__":
    main()
