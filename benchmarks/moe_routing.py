"""Fine-grained MoE: NVIDIA's published MoE runs against the model, dropless and token-dropping
(issue 23; docs/accuracy.md, "Fine-grained MoE").

    python3 benchmarks/moe_routing.py

NVIDIA-NeMo/Megatron-Bridge's performance summaries (docs/performance-summary-archive.md @
0a25f911b2, and @ 067f987df0 for the releases after 26.02) print Qwen3-30B-A3B on 16 H100s and 8
B200s, Qwen3-235B-A22B on 256 H100s and DeepSeek-V3 on 256 B200s: 25.09 with token dropping,
the later releases dropless with the routing forced to balance. They are the held-out tables
tests/data/heldout-h100-moe.yaml and heldout-b200-moe.yaml, run as benchmarks/accuracy.py runs
them.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.validation import published as pub
from clustersim.validation.accuracy import predictor

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
TABLES = ("heldout-h100-moe.yaml", "heldout-b200-moe.yaml")


def describe(case: pub.PublishedCase) -> tuple[str, str, str, str]:
    """(GPU, release, routing, split) of one case."""
    s, p = case.scenario, case.scenario.parallel
    routing = "dropless" if s.model.capacity_factor is None else "token drop"
    pipeline = f"pp {p.pp}" + (f" x{p.virtual_stages}" if p.virtual_stages > 1 else "")
    experts = f"ep {p.ep}" + (f" (tp {p.tp}, etp {p.etp})" if p.folded else "")
    overlap = " a2a-ovl" if p.schedule == "combined-1f1b" else ""
    dispatch = " deepep" if p.moe_dispatcher == "deepep" else ""
    split = f"{pipeline} {experts} mb {s.training.micro_batch}{overlap}{dispatch}"
    gpu = s.cluster.gpu.id.split("-")[0].upper()
    return gpu, case.id.rsplit("-", 1)[1], routing, split


def main() -> None:
    print(f"{'model':15s} {'GPU':5s} {'build':8s} {'routing':10s} {'split':40s} "
          f"{'published':>9s} {'predicted':>9s} {'pub/pred':>9s}   (tokens/s per GPU)")
    engine = predictor("representative")
    for table in TABLES:
        for row in pub.predict_rows(pub.load_table(DATA / table), predict=engine):
            case, s = row.case, row.case.scenario
            gpu, release, routing, split = describe(case)
            published, predicted = case.published / s.cluster.gpus, row.predicted / s.cluster.gpus
            print(f"{s.model.name:15s} {gpu:5s} {release:8s} {routing:10s} {split:40s} "
                  f"{published:9,.0f} {predicted:9,.0f} {published / predicted:9.2f}")


if __name__ == "__main__":
    main()
