"""Scenarios and published tables shared by the simulator's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from clustersim.simulator.analytic import estimate
from clustersim.simulator.result import StepResult
from clustersim.simulator.scenario import Scenario, build_scenario
from clustersim.topologies.profile import Profile, profile_for_gpu
from clustersim.yamlio import load_yaml_file

DATA = Path(__file__).parent.parent / "data"
PEAK = 989.4e12  # h100-sxm bf16
FREE = {"bandwidth": 1e9, "latency": 0.0}  # GB/s: communication costs nothing
FAST_HBM = {"preset": "h100-sxm", "memory_bandwidth": 1e12}  # GB/s: element-wise costs nothing


def flat_profile(eff: float = 1.0) -> Profile:
    """Every matmul at ``eff`` of peak, HBM and links at their line rate."""
    return Profile(name="flat", gpu="any", matmul_efficiency=[[1e6, eff]], memory_efficiency=1.0,
                   comm_efficiency={"intra_node": 1.0, "inter_node": 1.0, "spine": 1.0})


def scenario(layers=8, micro_batches=4, model=None, cluster=None, training=None, **parallel):
    """A small GPT with a tiny vocabulary (the logits are ~1e-4 of a stage) on free links."""
    p = {"tp": 1, "pp": 1, "dp": 1, **parallel}
    gpus = p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1)
    return build_scenario({
        "model": {"layers": layers, "hidden": 512, "heads": 8, "vocab": 8, "seq_len": 256,
                  **(model or {})},
        "cluster": {"preset": "dgx-h100", "gpus": gpus, "gpu": FAST_HBM, "intra_node": FREE,
                    "inter_node": FREE, **(cluster or {})},
        "training": {"global_batch": micro_batches * p["dp"], "micro_batch": 1,
                     **(training or {})},
        "parallel": p,
    })


def published_table(name: str, metric: str, predict: Callable[[Scenario], StepResult] = estimate,
                    **settings_) -> list[tuple[str, int, float, float]]:
    """(id, tp, predicted, published) for every case of a validation file, as printed."""
    rows = []
    for case in load_yaml_file(DATA / name):
        raw = case["scenario"]
        for section, values in settings_.items():
            raw[section] = {**raw[section], **values(raw)}
        s = build_scenario(raw)
        rows.append((case["id"], s.parallel.tp, getattr(predict(s), metric),
                     case["published"]["tflops_per_gpu"]))
    print(f"\n{name} ({metric}, profile {profile_for_gpu(s.cluster.gpu.id).name})")
    print(f"{'case':34s} {'predicted':>9s} {'published':>9s} {'error':>7s}")
    for case_id, _, predicted, published in rows:
        print(f"{case_id:34s} {predicted:9.1f} {published:9.1f} "
              f"{100 * (predicted - published) / published:+6.1f}%")
    return rows
