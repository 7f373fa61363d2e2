"""Run a shrunk scenario for real, predict it with the calibrated profile, and compare.

The measured step time is, for each step after the warm-up, the slowest rank's time (the
step ends when the last rank does), then the median over steps, with the spread of those
steps; the slowest rank's phases (forward, backward, pipeline waits, gradient sync,
optimizer) come with it. Measured peak memory on gloo is the largest over ranks of
parameters + gradients + optimizer state + activations held for backward
(validation/measure.py), compared with the same sum from the simulator's busiest stage
(communication buffers are left out of both); on NCCL it is
``torch.cuda.max_memory_allocated``, compared with the whole predicted peak. Errors are
relative: (predicted - measured) / measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.inputs.scenario import Scenario
from clustersim.topologies.profile import Profile

from .model import GPTShape
from .train import RunConfig


def run_config(s: Scenario, steps: int, backend: str = "gloo") -> RunConfig:
    """The harness run of a (shrunk) scenario: CPU tensors on gloo, this rank's GPU on NCCL."""
    p = s.parallel
    return RunConfig(GPTShape.from_spec(s.model), tp=p.tp, pp=p.pp, dp=p.dp, ep=p.ep,
                     cp=p.cp, cp_comm=p.cp_comm, expert_tp=p.expert_tp,
                     microbatches=s.microbatches, micro_batch=s.training.micro_batch,
                     schedule=p.schedule, virtual_stages=p.virtual_stages, zero=p.zero,
                     sequence_parallel=p.sequence_parallel, steps=steps,
                     device="cuda" if backend == "nccl" else "cpu",
                     precision=s.training.precision)


PHASES = ("forward", "backward", "pp_wait", "grad_sync", "optimizer")


@dataclass(frozen=True)
class Measurement:
    """What the real run measured, summarised over ranks and steps."""

    step_time_s: float
    step_time_spread_s: float
    peak_bytes: int
    phases_s: dict[str, float]  # the slowest rank's median time per phase
    per_rank: list[dict]

    @classmethod
    def of(cls, results: list[dict], warmup: int = 1) -> Measurement:
        steps = list(zip(*(r["step_times"] for r in results), strict=True))
        slowest = [max(times) for times in steps][warmup:]
        peaks = [r["cuda_max_allocated"] or sum(r["memory"].values()) for r in results]
        critical = max(results, key=lambda r: statistics.median(r["step_times"][warmup:]))
        seen = {k for step in critical["phases"] for k in step}
        names = [k for k in PHASES if k in seen] + sorted(seen - set(PHASES))
        phases = {k: statistics.median(step.get(k, 0.0) for step in critical["phases"][warmup:])
                  for k in names}
        return cls(statistics.median(slowest), max(slowest) - min(slowest), max(peaks), phases,
                   [{"rank": r["rank"], "stage": r["stage"], "step_times_s": r["step_times"],
                     "phases_s": r["phases"], "cuda_max_allocated": r["cuda_max_allocated"],
                     **r["memory"]} for r in results])

    def as_json(self) -> dict:
        return {"step_time_s": self.step_time_s, "step_time_spread_s": self.step_time_spread_s,
                "peak_bytes": self.peak_bytes, "phases_s": self.phases_s}


def predicted_peak_bytes(result: StepResult, backend: str = "gloo") -> int:
    """Model states and activations of the busiest stage, as gloo runs count them; on a GPU,
    where the allocator's peak also holds temporaries and buffers, the whole peak."""
    if backend == "nccl":
        return int(result.peak_bytes)
    return int(max(st.params + st.grads + st.optimizer + st.activations
                   for st in result.per_stage))


def predict(s: Scenario, profile: Profile) -> StepResult:
    from clustersim.simulator.discrete_event.engine import simulate
    return simulate(s, "representative", profile)


def comparison(s: Scenario, backend: str, nproc: int, predicted: StepResult,
               measured: Measurement) -> dict:
    """The ``validate --json`` object of SCENARIO.md."""
    peak = predicted_peak_bytes(predicted, backend)
    return {
        "scenario": s.as_dict(), "backend": backend, "nproc": nproc,
        "predicted": {"step_time_s": predicted.step_time_s, "peak_bytes": peak,
                      "breakdown_s": predicted.breakdown.as_dict()},
        "measured": measured.as_json(),
        "error": {"step_time": _error(predicted.step_time_s, measured.step_time_s),
                  "peak_bytes": _error(peak, measured.peak_bytes)},
    }


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured
