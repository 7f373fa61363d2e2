"""GPUs, link tiers and clusters as validated data, loaded from the YAML files beside this module.

Units follow SCENARIO.md: bytes, seconds, FLOP/s; bandwidth in GB/s (1e9 bytes/s) per GPU per
direction. A cluster is a two- or three-tier hierarchy: GPUs in a node share NVLink/NVSwitch
(``intra_node``), nodes share InfiniBand (``inter_node``), and an optional oversubscribed
``spine`` joins pods of ``pod_nodes`` nodes.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from clustersim.fields import (
    AtLeastOne,
    ByteCount,
    Bytes,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
)
from clustersim.yamlio import load_yaml_text

Precision = Literal["bf16", "fp16", "fp32", "tf32", "fp8"]

# Non-PyTorch memory of a training process on our own H100 (CUDA 13.0, PyTorch 2.11): 78.99 GiB
# in use, of which 77.69 allocated and 0.01 reserved by PyTorch's allocator
# (topologies/measurements/own/2026-11-25-h100-sxm/validate-gpt-6.7b.error.txt). Published
# figures sit near it: 1573 MiB of bare CUDA context on an A100 (bigscience-workshop/bigscience
# train/tr11-176B-ml/chronicles-prequel.md); 0.4-0.5 GiB in inference processes' OOM reports.
# NCCL's per-communicator buffers of a multi-GPU job come on top and are not counted.
RUNTIME_BYTES = round(1.29 * 2**30)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Spec):
    """One accelerator: dense peak FLOP/s per precision, memory size and bandwidth."""

    id: str = Field(
        "custom", description="catalogue key (gpus.yaml); picks the calibration profile")
    name: str = Field("", description="display name")
    peak_flops: dict[Precision, PositiveFloat] = Field(
        description="dense peak FLOP/s per precision (bf16, fp16 and fp32 required)")
    memory_bytes: ByteCount = Field(description="memory as CUDA reports it, bytes")
    runtime_bytes: Bytes = Field(
        RUNTIME_BYTES, description="memory a training process holds outside its tensors "
        "(CUDA context, cuBLAS workspaces, loaded kernels: 1.29 GiB measured on an H100), bytes")
    memory_bandwidth: PositiveFloat = Field(description="HBM bandwidth, GB/s")
    sm_count: PositiveInt | None = Field(
        None, description="streaming multiprocessors (GEMM wave quantisation)")
    source: str = Field("", description="where the figures come from")

    @property
    def tensor_memory_bytes(self) -> int:
        """What the tensors a memory estimate counts may use: the device less the runtime."""
        return self.memory_bytes - self.runtime_bytes

    @model_validator(mode="after")
    def _consistent(self) -> GpuSpec:
        missing = {"bf16", "fp16", "fp32"} - set(self.peak_flops)
        if missing:
            raise ValueError(f"peak_flops lacks {', '.join(sorted(missing))}")
        if self.runtime_bytes >= self.memory_bytes:
            raise ValueError(f"runtime_bytes ({self.runtime_bytes:,}) leaves no memory of "
                             f"memory_bytes ({self.memory_bytes:,}) for tensors")
        return self


class LinkTier(_Spec):
    """Bandwidth (GB/s per GPU per direction) and per-message latency (s) of one tier."""

    bandwidth: PositiveFloat = Field(description="GB/s per GPU per direction")
    latency: NonNegativeFloat = Field(description="per-message latency, seconds")
    kind: str = Field("", description="free text: nvlink, infiniband, ethernet, pcie")
    nvls: bool = Field(False, description="NVLink SHARP: the NVSwitch reduces all-reduces "
                       "itself (third-generation NVSwitch, H100 and later; NCCL's NVLS)")
    efficiency: Fraction | None = Field(
        None, description="fraction of `bandwidth` that NCCL reaches on this link, as measured "
        "on the cluster (nccl-tests' bus bandwidth over the line rate); null: the GPU "
        "profile's `comm_efficiency` for the tier, measured on NVIDIA's own fabrics")


class ScaleOutTier(LinkTier):
    """The links between nodes, and how switches join them inside a pod (full fidelity routes
    flows over them; representative charges the leaves' oversubscription in closed form).

    ``rail-optimized`` (NVIDIA SuperPOD): NIC i of each node on rail leaf i, ``leaf_ports``
    nodes to a leaf; ``fat-tree``: all NICs of ``leaf_ports / gpus_per_node`` nodes on one leaf;
    both reach ``spines`` spine switches over uplinks carrying ``1 / oversubscription`` of the
    leaf's down-ports, a flow's spine chosen by static ECMP hashing (``ecmp_seed``, as
    Ethernet/RoCE switches route) or spread over all of them (``routing: adaptive``, as
    InfiniBand's adaptive routing sprays packets).
    ``rail-only`` (no spine): rail leaves span the pod. Under both rail topologies a message to
    another rail first crosses NVLink to the GPU of its node on the destination's rail (PXN).
    """

    topology: Literal["rail-optimized", "fat-tree", "rail-only"] = Field(
        "rail-optimized", description="how leaf switches join the nodes' NICs")
    oversubscription: AtLeastOne = Field(
        1.0, description="leaf down-port to uplink bandwidth ratio (2: 2:1)")
    leaf_ports: PositiveInt = Field(32, description="NIC ports under one leaf switch")
    spines: PositiveInt = Field(8, description="spine switches a leaf reaches (ECMP paths)")
    ecmp_seed: int = Field(0, description="seed of the static ECMP hash of (sender, receiver)")
    routing: Literal["ecmp", "adaptive"] = Field(
        "ecmp", description="spine choice between leaves: static ECMP hash per flow (Ethernet, "
        "RoCE) or adaptive, every flow spread over all spines (InfiniBand AR)")


class SpineTier(LinkTier):
    """An oversubscribed tier above pods of ``pod_nodes`` nodes with full bisection inside."""

    pod_nodes: PositiveInt = Field(description="nodes per pod (full bisection inside a pod)")


class LinkFault(_Spec):
    """One GPU's port running below its rated bandwidth, both ways (a degraded cable, a NIC
    that trained at a lower link speed)."""

    gpu: NonNegativeInt = Field(description="the GPU's global rank")
    port: Literal["nvlink", "nic"] = Field(description="its NVLink port or its NIC")
    bandwidth_factor: Fraction = Field(
        description="fraction of the rated bandwidth left (0.5: half)")


class Variability(_Spec):
    """How far GPUs of one model run from each other: each GPU's compute takes a lognormal
    factor ``exp(sigma z)`` (median 1) of its nominal time, and a fraction of the GPUs is
    ``slow_factor`` times slower still (thermal throttling, a bad HBM stack). Drawn once per
    GPU for the step, seeded."""

    compute_sigma: NonNegativeFloat = Field(
        0.0, description="lognormal sigma of each GPU's compute-time factor (0.02: ~2% spread)")
    slow_fraction: Probability = Field(
        0.0, description="fraction of GPUs that are stragglers")
    slow_factor: AtLeastOne = Field(
        1.0, description="how many times slower a straggler computes")
    link_sigma: NonNegativeFloat = Field(
        0.0, description="lognormal sigma of each GPU port's achieved bandwidth (NVLink, NIC)")
    seed: int = Field(0, description="seed of the per-GPU draws (full fidelity)")


class ClusterSpec(_Spec):
    """A homogeneous cluster of ``gpus`` GPUs, ``gpus_per_node`` to a node."""

    name: str = Field("custom", description="preset key (clusters.yaml)")
    gpu: GpuSpec = Field(description="the accelerator (a GPU preset name or a mapping)")
    gpus: PositiveInt = Field(description="GPUs in the cluster (or give nodes)")
    gpus_per_node: PositiveInt = Field(description="GPUs sharing one node's NVLink/NVSwitch")
    intra_node: LinkTier = Field(description="links within a node")
    inter_node: ScaleOutTier = Field(description="links between nodes and their switches")
    spine: SpineTier | None = Field(None, description="optional oversubscribed tier between pods")
    variability: Variability | None = Field(
        None, description="per-GPU compute spread and stragglers; null: identical GPUs")
    faults: list[LinkFault] = Field(
        default_factory=list, description="ports below their rated bandwidth (what-ifs)")
    source: str = Field("", description="where the figures come from")

    @model_validator(mode="after")
    def _whole_nodes(self) -> ClusterSpec:
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(
                f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})")
        return self

    @model_validator(mode="after")
    def _faults_on_real_gpus(self) -> ClusterSpec:
        for fault in self.faults:
            if fault.gpu >= self.gpus:
                raise ValueError(f"faults: gpu {fault.gpu} is not in a {self.gpus}-GPU cluster")
        return self

    def fault_factor(self, port: str, gpu: int | None = None) -> float:
        """The smallest bandwidth factor among ``port`` faults, of ``gpu`` or of any (1: none)."""
        return min((f.bandwidth_factor for f in self.faults
                    if f.port == port and gpu in (None, f.gpu)), default=1.0)

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    def tier_of_span(self, span_gpus: int) -> tuple[str, LinkTier]:
        """The slowest tier a group crosses when it occupies ``span_gpus`` consecutive ranks."""
        if span_gpus <= self.gpus_per_node:
            return "intra_node", self.intra_node
        if self.spine is not None and span_gpus > self.spine.pod_nodes * self.gpus_per_node:
            return "spine", self.spine
        return "inter_node", self.inter_node


def _read_catalogue(name: str) -> dict:
    text = files("clustersim.topologies").joinpath(name).read_text(encoding="utf-8")
    return load_yaml_text(text, source=name)


@cache
def gpu_presets() -> dict[str, dict]:
    """GPU catalogue entries by id, as raw mappings (``gpus.yaml``)."""
    return _read_catalogue("gpus.yaml")


@cache
def cluster_presets() -> dict[str, dict]:
    """Cluster presets by id, as raw mappings (``clusters.yaml``); ``gpu`` names a GPU id."""
    return _read_catalogue("clusters.yaml")
