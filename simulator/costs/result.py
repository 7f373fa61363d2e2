"""StepResult: what one simulation predicts, and its JSON form (SCENARIO.md, "JSON result");
``step_result`` makes one from a predicted step time, for either estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from clustersim.topologies.pools import cluster_pools, is_pooled, mean_peak_flops

from ..model import workload as wl
from . import traffic
from .memory import StageMemory, memory_per_stage
from .stage_breakdown import StageBreakdown, bottleneck

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Step time on the critical path of the slowest rank, by cause; sums to the step time."""

    compute: float
    exposed_comm: float
    bubble: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.compute + self.exposed_comm + self.bubble + self.optimizer

    def as_dict(self) -> dict[str, float]:
        return {"compute": self.compute, "exposed_comm": self.exposed_comm,
                "bubble": self.bubble, "optimizer": self.optimizer}


@dataclass(frozen=True, slots=True)
class StepResult:
    """Predicted step time, throughput, utilisation and per-stage peak memory of a scenario."""

    name: str
    gpus: int
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    breakdown: Breakdown
    capacity_bytes: int
    per_stage: list[StageMemory]
    time_to_train_s: float | None
    fidelity: str = "analytic"
    extras: dict[str, Any] = field(default_factory=dict)
    # Each pipeline stage's step by cause (stage_breakdown.py); empty where not estimated.
    stages: list[StageBreakdown] = field(default_factory=list)

    @property
    def peak_bytes(self) -> float:
        return max(stage.peak_bytes for stage in self.per_stage)

    @property
    def fits(self) -> bool:
        return self.fits_within(0.0)

    def fits_within(self, reserve: float) -> bool:
        """Every stage's peak within its GPU's memory less a ``reserve`` fraction of it."""
        return all(stage.peak_bytes <= (1 - reserve) * self.stage_capacity(stage)
                   for stage in self.per_stage)

    def stage_capacity(self, stage: StageMemory) -> int:
        """The memory of the GPUs a stage runs on: its pool's, on a cluster of pools."""
        return self.capacity_bytes if stage.capacity_bytes is None else stage.capacity_bytes

    @property
    def headroom_bytes(self) -> float:
        """Memory left on the fullest GPU, relative to its own capacity."""
        return min(self.stage_capacity(st) - st.peak_bytes for st in self.per_stage)

    def to_json(self) -> dict[str, Any]:
        """The JSON result object of SCENARIO.md (every listed field, plus ``fidelity``)."""
        return {
            "name": self.name,
            "gpus": self.gpus,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "breakdown_s": self.breakdown.as_dict(),
            **self._stages_json(),
            "memory": {
                "capacity_bytes": self.capacity_bytes,
                "peak_bytes": int(round(self.peak_bytes)),
                "fits": self.fits,
                "per_stage": [_stage_json(stage) for stage in self.per_stage],
            },
            "time_to_train_s": self.time_to_train_s,
            "fidelity": self.fidelity,
            **self.extras,
        }

    def _stages_json(self) -> dict[str, Any]:
        """``breakdown_per_stage`` and ``bottleneck`` (SCENARIO.md), when estimated."""
        if not self.stages:
            return {}
        critical = bottleneck(self.stages)
        return {"breakdown_per_stage": [b.as_dict() for b in self.stages],
                "bottleneck": critical.as_dict()}


def _stage_json(stage: StageMemory) -> dict[str, Any]:
    out = {"stage": stage.stage, "peak_bytes": int(round(stage.peak_bytes)),
           "params": int(round(stage.params)), "grads": int(round(stage.grads)),
           "optimizer": int(round(stage.optimizer)),
           "activations": int(round(stage.activations)), "buffers": int(round(stage.buffers))}
    if stage.optimizer_step > 0:  # a foreach optimizer's step holds more than the states
        out["optimizer_step"] = int(round(stage.optimizer_step))
    if stage.pool is not None:  # a cluster of pools: which pool, and its GPUs' memory
        out.update(pool=stage.pool, capacity_bytes=stage.capacity_bytes)
    return out


def step_result(s: Scenario, step: float, breakdown: Breakdown,
                per_stage: list[StageMemory] | None = None,
                fidelity: str = "analytic", stages: list | None = None) -> StepResult:
    """The StepResult of a predicted step time; memory from the closed forms unless given;
    ``stages``, each pipeline stage's breakdown (``stage_breakdown.py``)."""
    gpus = s.cluster.gpus
    tokens = s.training.global_batch * s.model.seq_len
    model_tflops = wl.model_flops_per_step(s) / step / gpus / 1e12
    hardware_tflops = wl.hardware_flops_per_step(s) / step / gpus / 1e12
    # MFU over the dense bf16 peak under fp8 too, so runs in either precision share a scale.
    peak = mean_peak_flops(s.cluster, wl.WIDE.get(s.training.precision, s.training.precision))
    to_train = s.training.tokens / (tokens / step) if s.training.tokens else None
    per_stage = per_stage if per_stage is not None else memory_per_stage(s)
    capacity, per_stage = _capacities(s, per_stage)
    return StepResult(
        name=s.name, gpus=gpus, step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=model_tflops, hardware_tflops_per_gpu=hardware_tflops,
        mfu=model_tflops * 1e12 / peak, breakdown=breakdown,
        capacity_bytes=capacity, per_stage=per_stage,
        time_to_train_s=to_train, fidelity=fidelity,
        extras={"traffic_bytes": traffic.traffic_bytes(s)}, stages=stages or [])


def _capacities(s: Scenario, per_stage: list[StageMemory]
                ) -> tuple[int, list[StageMemory]]:
    """The memory tensors may use on a GPU of the result (the device less the process's
    runtime, ``GpuSpec.tensor_memory_bytes``), and its stages: on a cluster of pools, each
    stage tagged with its pool and that pool's, and the smallest of those as the result's."""
    if not is_pooled(s.cluster):
        return s.cluster.gpu.tensor_memory_bytes, per_stage
    pools = cluster_pools(s.cluster)
    tagged = [replace(st, pool=k, capacity_bytes=pools[k].gpu.tensor_memory_bytes)
              for st, k in zip(per_stage, s.parallel.stage_pools, strict=True)]
    return min(st.capacity_bytes for st in tagged), tagged
