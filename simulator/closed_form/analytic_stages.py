"""Each stage's times and breakdown in the analytic estimator (``--fidelity analytic``), in
closed form.

``analytic.stage_times`` gives a stage's ``StageTimes``: its compute, exposed communication per
micro-batch (TP, CP and EP collectives of its layers, pipeline sends, ZeRO-3's per-unit
traffic), its exposed data-parallel traffic once per step and its optimizer step. Here the
per-micro-batch communication is split by the group it runs over, from the same per-layer
closed forms (``layer_comm``): TP, CP and EP per layer times the stage's layers, pipeline sends
as ``_pipeline_sends`` costs them, and the rest (ZeRO-3's gathers and reduce-scatters) data
parallel. The bubble is what the step leaves of the stage's busy time, as the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..costs.stage_breakdown import StageBreakdown, stage_breakdown
from ..pipeline.stages import microbatch_share

if TYPE_CHECKING:
    from ..costs.cost_model import CostModel


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's time per micro-batch (compute, exposed comm) and once per step."""

    forward: float  # compute of one micro-batch's forward
    backward: float  # compute of its backward, recomputation included
    comm: float  # exposed TP/CP/EP collectives and pipeline sends, per micro-batch
    grad_sync: float  # exposed data-parallel gradient/parameter traffic, per step
    optimizer: float  # optimizer step, per step
    weight_grad: float = 0.0  # the weight-gradient GEMMs among the backward's compute
    split_cost: float = 0.0  # exposed time a split backward adds (split_backward.lost_cover)
    slowdown: float = 0.0  # compute lost beside communication (the profile's)
    pair_hidden: float = 0.0  # of ``comm``, what an overlapped F&B pair hides: all-to-alls, sends

    @property
    def per_microbatch(self) -> float:
        return self.forward + self.backward + self.comm


def stage_comm_kinds(cm: CostModel, stage: int, times: StageTimes,
                     sends: float) -> dict[str, float]:
    """A stage's exposed communication per micro-batch by kind, with ``sends`` seconds of
    pipeline sends; what ``times.comm`` holds beyond its layers' and sends' is ZeRO-3's."""
    share = microbatch_share(cm.s)
    dense_layers, others = (n * share for n in cm.stage_mix[stage])
    kinds = {k: others * t for k, t in cm.per_layer_comm_kinds.items()}
    if dense_layers:
        for k, t in cm.dense_layer_costs.per_layer_comm_kinds.items():
            kinds[k] += dense_layers * t
    kinds["pp"] = sends
    kinds["dp"] = max(0.0, times.comm - sum(kinds.values()))
    return kinds


def stage_breakdowns(costs, stages: list[StageTimes], sends: list[float], m: int,
                     step: float) -> list[StageBreakdown]:
    """Every stage's breakdown over a step of ``m`` micro-batches lasting ``step``; ``costs``
    is the scenario's ``StageCosts`` (each stage's pool's cost model)."""
    out = []
    for i, t in enumerate(stages):
        kinds = {k: m * x for k, x in stage_comm_kinds(costs.stage(i), i, t, sends[i]).items()}
        kinds["dp"] += t.grad_sync
        out.append(stage_breakdown(i, step, m * (t.forward + t.backward), kinds, t.optimizer))
    return out
