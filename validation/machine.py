"""The machine real runs happen on: its backend, its ranks, and the cluster spec describing it.

gloo runs one CPU process per rank on this machine (``localhost-gloo``: ``cpu-core`` devices
on loopback); NCCL runs one process per visible GPU, described by the catalogue cluster of
that GPU. Asking for what the machine lacks is bad input: one ``error:`` line.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.topologies.hardware import ClusterSpec, cluster_presets, gpu_presets

BACKENDS = ("gloo", "nccl")


def require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ScenarioError("--backend", "real runs need torch: pip install torch==2.13.0 "
                                         "-e '.[validation]'") from None


def check_backend(backend: str, nproc: int) -> None:
    """The backend exists here and can host ``nproc`` ranks."""
    require_torch()
    import torch
    if nproc < 1:
        raise ScenarioError("--nproc", f"expected a positive integer, got {nproc}")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ScenarioError("--backend", "nccl needs CUDA GPUs and this machine has none; "
                                             "use --backend gloo")
        if nproc > torch.cuda.device_count():
            raise ScenarioError("--nproc", f"{nproc} ranks but only "
                                           f"{torch.cuda.device_count()} GPUs")
    elif nproc > 4 * (os.cpu_count() or 1):
        raise ScenarioError("--nproc", f"{nproc} ranks on {os.cpu_count()} cores would only "
                                       "measure time-sharing")


def default_nproc(backend: str) -> int:
    if backend == "nccl":
        import torch
        return max(torch.cuda.device_count(), 1)
    return max(2, min(os.cpu_count() or 2, 8))


def local_cluster(backend: str, nproc: int) -> ClusterSpec:
    """The cluster spec of the ranks a real run here starts."""
    if backend == "gloo":
        return build_cluster({"preset": "localhost-gloo", "gpus": nproc})
    gpu = detect_gpu()
    preset = next(name for name, c in cluster_presets().items() if c["gpu"] == gpu)
    return build_cluster({"preset": preset, "gpus": nproc,
                          "gpus_per_node": max(nproc, 8)})


def detect_gpu() -> str:
    """The catalogue id of GPU 0, matched by name and memory (e.g. "NVIDIA H100 80GB HBM3")."""
    import torch
    name = torch.cuda.get_device_name(0).upper()
    memory = torch.cuda.get_device_properties(0).total_memory
    candidates = [gid for gid in gpu_presets() if gid.split("-")[0].upper() in name]
    if not candidates:
        raise ScenarioError("--backend", f"GPU {name!r} is not in topologies/gpus.yaml")
    return min(candidates, key=lambda gid: abs(gpu_presets()[gid]["memory_bytes"] - memory))


def profiles_folder() -> Path:
    return Path(str(files("clustersim.topologies").joinpath("profiles")))


def device(backend: str) -> str:
    """This machine's profile name for the backend (``cpu-core``, ``h100-sxm-measured``)."""
    from .profiles import device_name
    return device_name(backend, None if backend == "gloo" else detect_gpu())
