"""Run a shrunk scenario for real, predict it with the calibrated profile, and compare.

The measured step time is, for each step after the warm-up, the slowest rank's time (the
step ends when the last rank does), then the median over steps, with the spread of those
steps. Measured peak memory is the largest over ranks of parameters + gradients + optimizer
state + activations held for backward (validation/measure.py); the prediction compared with
it is the same sum from the simulator's busiest stage (communication buffers are left out of
both). Errors are relative: (predicted - measured) / measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from clustersim.simulator.result import StepResult
from clustersim.simulator.scenario import Scenario
from clustersim.topologies.profile import Profile

from .model import GPTShape
from .train import RunConfig


def run_config(s: Scenario, steps: int) -> RunConfig:
    """The harness run of a (shrunk) scenario."""
    p = s.parallel
    return RunConfig(GPTShape.from_spec(s.model), tp=p.tp, pp=p.pp, dp=p.dp,
                     microbatches=s.microbatches, micro_batch=s.training.micro_batch,
                     schedule=p.schedule, virtual_stages=p.virtual_stages, zero=p.zero,
                     sequence_parallel=p.sequence_parallel, steps=steps)


@dataclass(frozen=True)
class Measurement:
    """What the real run measured, summarised over ranks and steps."""

    step_time_s: float
    step_time_spread_s: float
    peak_bytes: int
    per_rank: list[dict]

    @classmethod
    def of(cls, results: list[dict], warmup: int = 1) -> Measurement:
        steps = list(zip(*(r["step_times"] for r in results), strict=True))
        slowest = [max(times) for times in steps][warmup:]
        peaks = [sum(r["memory"].values()) for r in results]
        return cls(statistics.median(slowest), max(slowest) - min(slowest), max(peaks),
                   [{"rank": r["rank"], "stage": r["stage"], "step_times_s": r["step_times"],
                     **r["memory"]} for r in results])

    def as_json(self) -> dict:
        return {"step_time_s": self.step_time_s, "step_time_spread_s": self.step_time_spread_s,
                "peak_bytes": self.peak_bytes}


def predicted_peak_bytes(result: StepResult) -> int:
    """Model states and activations of the busiest stage (buffers left out, as measured)."""
    return int(max(st.params + st.grads + st.optimizer + st.activations
                   for st in result.per_stage))


def predict(s: Scenario, profile: Profile) -> StepResult:
    from clustersim.simulator.engine import simulate
    return simulate(s, "representative", profile)


def comparison(s: Scenario, backend: str, nproc: int, predicted: StepResult,
               measured: Measurement) -> dict:
    """The ``validate --json`` object of SCENARIO.md."""
    peak = predicted_peak_bytes(predicted)
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
