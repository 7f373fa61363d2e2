"""Scenarios, profiles and the published tables' folder shared by the simulator's tests."""

from __future__ import annotations

from pathlib import Path

import simpy

from clustersim.simulator.inputs.scenario import build_cluster, build_scenario
from clustersim.simulator.network.fabric import Fabric
from clustersim.topologies.profile import Profile

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


def flat_fabric(gpus: int, nvlink: tuple[float, float], nic: tuple[float, float],
                **cluster) -> tuple[simpy.Environment, Fabric]:
    """A fresh clock and the full-fidelity fabric of ``gpus`` DGX-H100-shaped GPUs whose NVLink
    and NIC tiers run at (bytes/s, alpha) at their line rate (``flat_profile``)."""
    env = simpy.Environment()
    section = {"preset": "dgx-h100", "gpus": gpus,
               "intra_node": {"bandwidth": nvlink[0] / 1e9, "latency": nvlink[1]},
               "inter_node": {"bandwidth": nic[0] / 1e9, "latency": nic[1]}, **cluster}
    return env, Fabric(env, build_cluster(section), flat_profile())


def elapsed(env: simpy.Environment, *bodies) -> float:
    """Run ``bodies`` (fabric generators) from now to the end; the time it took."""
    for body in bodies:
        env.process(body)
    env.run()
    return env.now


def no_slowdown(gpu_id: str) -> Profile:
    """The shipped profile of ``gpu_id`` with overlapped communication costing compute
    nothing: for tests of where traffic hides, whose oracles leave the slowdown out."""
    from clustersim.topologies.profile import profile_for_gpu
    return profile_for_gpu(gpu_id).model_copy(update={"comm_compute_slowdown": 0.0})
