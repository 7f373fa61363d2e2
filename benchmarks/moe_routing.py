"""Fine-grained MoE: NVIDIA's published Qwen3-30B-A3B runs against the model, dropless and
token-dropping (issue 23; docs/accuracy.md, "Fine-grained MoE").

    python3 benchmarks/moe_routing.py

NVIDIA-NeMo/Megatron-Bridge's performance summaries (docs/performance-summary-archive.md @
0a25f911b2) print Qwen3-30B-A3B on 16 H100s and 8 B200s, one split per GPU, in three releases:
25.09 with token dropping, 25.11 and 26.02 dropless with the routing forced to balance. The H100
rows are the held-out table tests/data/heldout-h100-moe.yaml; the B200 rows (8 GPUs, global
batch 512, micro-batch 1, sequence 4096, EP 8, no TP or PP; FP8, MXFP8 in 26.02) are written
here, scenario for scenario the same but the GPU and the split.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.validation import published as pub

TABLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout-h100-moe.yaml"
# (release, routing, published tokens/s per GPU) of the B200 rows
B200_ROWS = (("25.09", "token drop", 18066), ("25.11", "dropless", 9299),
             ("26.02", "dropless", 9691))


def b200_scenario(dropping: bool) -> dict:
    model = {"preset": "qwen3-30b-a3b", "seq_len": 4096,
             "capacity_factor": 1.0 if dropping else None}
    return {"model": model, "cluster": {"preset": "dgx-b200", "gpus": 8},
            "training": {"global_batch": 512, "micro_batch": 1, "precision": "fp8"},
            "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1, "recompute": "none"}}


def line(gpu: str, release: str, routing: str, split: str, published: float,
         predicted: float) -> str:
    return (f"{gpu:5s} {release:6s} {routing:10s} {split:24s} {published:9,.0f} "
            f"{predicted:9,.0f} {published / predicted:9.2f}")


def main() -> None:
    print(f"{'GPU':5s} {'build':6s} {'routing':10s} {'split':24s} {'published':>9s} "
          f"{'predicted':>9s} {'pub/pred':>9s}   (tokens/s per GPU)")
    for case in pub.load_table(TABLE):
        s = case.scenario
        release = case.id.rsplit("-", 1)[1]
        routing = "dropless" if s.model.capacity_factor is None else "token drop"
        split = (f"pp {s.parallel.pp} x{s.parallel.virtual_stages} ep {s.parallel.ep} "
                 f"mb {s.training.micro_batch}")
        predicted = simulate(s).tokens_per_s / s.cluster.gpus
        print(line("H100", release, routing, split, case.published / s.cluster.gpus, predicted))
    for release, routing, published in B200_ROWS:
        s = build_scenario(b200_scenario(routing == "token drop"))
        print(line("B200", release, routing, "ep 8 mb 1", published,
                   simulate(s).tokens_per_s / s.cluster.gpus))


if __name__ == "__main__":
    main()
