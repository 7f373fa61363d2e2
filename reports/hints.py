"""Fit hints: when a scenario runs out of memory, the nearest changes that make it fit.

The search changes one field at a time first — a fused optimizer in place of foreach, more
pipeline stages, recomputation, a higher ZeRO stage, a smaller micro-batch, context
parallelism for long sequences, tensor parallelism within a node, sequence parallelism — and
tries pairs of them only when no single change fits. ``dp`` is re-derived from the GPU count
(and written into the hint only when the scenario pins it). Every candidate is validated like
a scenario file, screened with the analytic estimate, and the most promising are run at the
caller's fidelity, whose step time and peak memory the hint reports; a hint is offered only if
that run fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.inputs.scenario import Scenario, apply_values, build_scenario

MAX_HINTS = 5
# The analytic estimate screens; its memory can differ a little from the engine's timeline, so
# candidates within this margin of the capacity still get a run at the caller's fidelity.
SCREEN_MARGIN = 1.10
RUNS_PER_HINT = 3  # engine runs allowed per hint wanted, best analytic candidates first
LONG_SEQUENCE = 16384  # context parallelism is offered from here on (as the planner does)
RECOMPUTE_ORDER = ("none", "selective", "full")

Runner = Callable[[Scenario], StepResult]


@dataclass(frozen=True)
class FitHint:
    """One change (dotted path -> value) and what the scenario does with it."""

    set: dict
    peak_bytes: int
    step_time_s: float
    fidelity: str

    def as_dict(self) -> dict:
        return {"set": self.set, "peak_bytes": self.peak_bytes, "step_time_s": self.step_time_s,
                "fidelity": self.fidelity}

    def as_flags(self) -> str:
        """The hint as ``--set`` flags, ready to paste after ``clustersim simulate FILE``."""
        return " ".join(f"--set {k}={_flag_value(v)}" for k, v in self.set.items())


def fit_hints(raw: dict, scenario: Scenario, run: Runner,
              limit: int = MAX_HINTS) -> list[FitHint]:
    """Up to ``limit`` changes of ``raw`` (the scenario mapping as given, overrides applied)
    after which ``run`` finds that it fits, fastest first (ties: more free memory first)."""
    singles = list(_single_changes(scenario))
    hints = _fitting(raw, scenario, singles, run, limit)
    if hints:
        return hints
    pairs = [{**a, **b} for a, b in itertools.combinations(singles, 2)
             if not set(a) & set(b)]
    return _fitting(raw, scenario, pairs, run, limit)


def _fitting(raw: dict, scenario: Scenario, changes: list[dict], run: Runner,
             limit: int) -> list[FitHint]:
    screened = []
    for change in changes:
        built = _build(raw, scenario, change)
        if built is None:
            continue
        full_change, s = built
        analytic = estimate(s)
        if analytic.fits_within(1 - SCREEN_MARGIN):
            screened.append((analytic.step_time_s, full_change, s))
    screened.sort(key=lambda item: item[0])
    hints = []
    for _, change, s in screened[: RUNS_PER_HINT * limit]:
        result = run(s)
        if result.fits:
            hints.append(FitHint(change, int(round(result.peak_bytes)), result.step_time_s,
                                 result.fidelity))
    hints.sort(key=lambda h: (round(h.step_time_s, 9), h.peak_bytes))
    return hints[:limit]


def _build(raw: dict, scenario: Scenario, change: dict) -> tuple[dict, Scenario] | None:
    """The change (with ``dp`` re-derived when the scenario pins it) and its scenario, or
    None when the combination is invalid."""
    change = dict(change)
    given = raw.get("parallel") or {}
    if "dp" in given and "parallel.dp" not in change:
        p = scenario.parallel
        mp = (change.get("parallel.tp", p.tp) * change.get("parallel.pp", p.pp)
              * change.get("parallel.cp", p.cp))
        if mp != p.model_parallel:
            if scenario.cluster.gpus % mp:
                return None
            change["parallel.dp"] = scenario.cluster.gpus // mp
    if given.get("stage_layers") is not None and "parallel.pp" in change:
        change["parallel.stage_layers"] = None  # a new pipeline depth spreads layers evenly
    if (given.get("recompute_modules") is not None
            and change.get("parallel.recompute", "selective") != "selective"):
        change["parallel.recompute_modules"] = None  # they choose what selective re-runs
    resized = {"parallel.tp", "parallel.pp", "parallel.cp", "parallel.dp"} & set(change)
    if given.get("stage_pools") is not None and resized:
        change["parallel.stage_pools"] = None  # new stages fill the pools in order
    try:
        return change, build_scenario(apply_values(raw, change), scenario.name)
    except ScenarioError:
        return None


def _single_changes(s: Scenario) -> Iterator[dict]:
    """Every one-field change that saves memory, in the order users reach for them."""
    p, m, c = s.parallel, s.model, s.cluster
    if s.training.optimizer_impl == "foreach":  # a fused step holds nothing beyond the states
        yield {"training.optimizer_impl": "fused"}
    for pp in _doublings(p.pp, m.layers):
        yield {"parallel.pp": pp}
    for recompute in RECOMPUTE_ORDER[RECOMPUTE_ORDER.index(p.recompute) + 1:]:
        yield {"parallel.recompute": recompute}
    for zero in range(p.zero + 1, 4):
        yield {"parallel.zero": zero}
    mb = s.training.micro_batch
    while mb > 1:
        mb //= 2
        yield {"training.micro_batch": mb}
    if m.seq_len >= LONG_SEQUENCE:
        for cp in _doublings(p.cp, 8):
            yield {"parallel.cp": cp}
    for tp in _doublings(p.tp, c.gpus_per_node):
        yield {"parallel.tp": tp}
    if p.tp > 1 and not p.sequence_parallel:
        yield {"parallel.sequence_parallel": True}


def _doublings(value: int, limit: int) -> list[int]:
    out = []
    while value * 2 <= limit:
        value *= 2
        out.append(value)
    return out


def _flag_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def hint_lines(hints: list[FitHint]) -> list[str]:
    """The hints as text lines for the terminal report."""
    if not hints:
        return ["No single change (or pair) of pp, recompute, ZeRO stage, micro-batch, cp, tp "
                "or sequence parallelism makes it fit: try more GPUs."]
    lines = ["Would fit with (fastest first):"]
    width = max(len(h.as_flags()) for h in hints)
    for h in hints:
        lines.append(f"  {h.as_flags():<{width}}  peak {h.peak_bytes / 2**30:6.2f} GiB, "
                     f"step {h.step_time_s:.3f} s ({h.fidelity})")
    return lines
