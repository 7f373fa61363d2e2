"""The best published run of a plan's kind, and what the model credits a plan that beats it.

A planner that promises more than anyone has measured must say what earns the difference.
``published_records.yaml`` holds, per model preset, GPU and precision, the best published run we
know with the split it ran. ``record_for`` finds a plan's; ``credits`` walks from that run to the
plan one group of settings at a time, simulating each step with the engine, so that the credit
for each part of the difference is the model's own (``benchmarks/plan_waterfall.py`` printed
this walk by hand for GPT-3 175B on A100).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

import yaml

from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import Scenario, apply_values, build_scenario

# The groups of settings the walk changes, in order: what a run's software lacked, then its
# size, then the split (dp follows from the GPUs and the split at every step). A group whose
# values are the record's is skipped; one that cannot run alone joins the next.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fused attention", ("training.flash_attention", "training.attention_kernel")),
    ("cluster and global batch", ("cluster", "training.global_batch")),
    ("tensor, sequence and context parallelism",
     ("parallel.tp", "parallel.sequence_parallel", "parallel.cp")),
    ("micro-batch", ("training.micro_batch",)),
    ("recomputation", ("parallel.recompute", "parallel.recompute_modules")),
    ("pipeline and schedule", ("parallel.pp", "parallel.schedule", "parallel.virtual_stages",
                               "parallel.stage_layers", "parallel.layer_split")),
    ("ZeRO stage", ("parallel.zero",)),
    ("TP overlap", ("parallel.tp_comm_overlap",)),
)


_THROUGHPUT_MFU: dict[tuple[str, str, str], float] = {}  # Record.mfu of throughput records

# Fields that change no step: set to the plan's before the walk.
UNTIMED = ("name", "training.tokens")


@dataclass(frozen=True)
class Record:
    """One published run: its kind, its figure as printed, and the split it ran."""

    model: str
    gpu: str
    precision: str  # "fp8", or "bf16" for every other precision
    metric: str  # "mfu" (percent) or "tokens_per_s"
    value: float
    source: str
    scenario: dict

    def mfu(self) -> float:
        """The record's MFU as a fraction: as printed, or the model's MFU of its scenario
        scaled by published over predicted throughput (simulated once per record)."""
        if self.metric == "mfu":
            return self.value / 100
        key = (self.model, self.gpu, self.precision)
        if key not in _THROUGHPUT_MFU:
            r = _result(self.scenario)
            _THROUGHPUT_MFU[key] = r.mfu * self.value / r.tokens_per_s
        return _THROUGHPUT_MFU[key]

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "precision": self.precision,
                "mfu": self.mfu(), "source": self.source}


@dataclass(frozen=True)
class Credit:
    """One step of the walk from the record to a plan: what changed, and the model's MFU, step
    time and its shares (compute, exposed communication, bubble) after it."""

    change: str
    mfu: float
    step_time_s: float
    shares: tuple[float, float, float]

    def as_dict(self) -> dict[str, Any]:
        return {"change": self.change, "mfu": self.mfu, "step_time_s": self.step_time_s,
                "compute_share": self.shares[0], "exposed_comm_share": self.shares[1],
                "bubble_share": self.shares[2]}


@cache
def records() -> tuple[Record, ...]:
    text = files("clustersim.reports").joinpath("published_records.yaml").read_text()
    fields = Record.__dataclass_fields__
    return tuple(Record(**{k: v for k, v in r.items() if k in fields})
                 for r in yaml.safe_load(text))


def kind(s: Scenario) -> tuple[str, str, str]:
    """(model, GPU, precision class) of a scenario."""
    return s.model.name, s.cluster.gpu.id, "fp8" if s.training.precision == "fp8" else "bf16"


def record_for(s: Scenario) -> Record | None:
    """The published record of ``s``'s kind, if one is known."""
    return next((r for r in records() if (r.model, r.gpu, r.precision) == kind(s)), None)


def credits(record: Record, plan: Scenario) -> list[Credit]:
    """The walk from ``record``'s run to ``plan``: the record as modelled, then each group of
    settings set to the plan's, and last whatever else differs; the last step is the plan."""
    target = plan.as_dict()
    current = build_scenario(record.scenario).as_dict()
    current = apply_values(current, _values(target, UNTIMED))  # they name the run, time no step
    steps = [Credit("the published run, as modelled", *_measures(current))]
    pending: list[str] = []
    base = current  # the last step's settings, with any group that could not run alone
    for label, paths in GROUPS:
        changed = apply_values(base, _values(target, paths))
        if changed == base:
            continue
        pending.append(f"{label} ({_describe(base, changed, paths)})")
        changed = apply_values(changed, {"parallel.dp": _dp(changed)})
        base = changed
        try:
            measures = _measures(changed)
        except ScenarioError:
            continue  # cannot run alone: joins the next group
        steps.append(Credit(" + ".join(pending), *measures))
        current, pending = changed, []
    if current != target:
        rest = " + ".join([*pending, "the rest of the plan's scenario"])
        steps.append(Credit(rest, *_measures(target)))
    return steps


def _measures(raw: dict) -> tuple[float, float, tuple[float, float, float]]:
    r = _result(raw)
    b, t = r.breakdown, r.step_time_s
    return r.mfu, t, (b.compute / t, b.exposed_comm / t, b.bubble / t)


def _result(raw: dict):
    return simulate(build_scenario(copy.deepcopy(raw)))


def _dp(raw: dict) -> int:
    p = raw["parallel"]
    return raw["cluster"]["gpus"] // (p["tp"] * p.get("cp", 1) * p["pp"])


def _get(raw: dict, path: str) -> Any:
    section, _, name = path.partition(".")
    return raw[section] if not name else raw[section].get(name)


def _values(raw: dict, paths: tuple[str, ...]) -> dict[str, Any]:
    """``raw``'s values at ``paths``, as ``apply_values`` takes them (each copied: the walk
    changes its own)."""
    return {path: copy.deepcopy(_get(raw, path)) for path in paths}


def _describe(before: dict, after: dict, paths: tuple[str, ...]) -> str:
    """The values a group changed, as ``name value``."""
    out = []
    for path in paths:
        old, new = _get(before, path), _get(after, path)
        if old == new:
            continue
        if path == "cluster":
            out.append(f"{new['gpus']:,} GPUs" + (f" of {new.get('preset')}" if
                                                  old.get("preset") != new.get("preset") else ""))
        else:
            out.append(f"{path.partition('.')[2]} {new}")
    return ", ".join(out)


@dataclass(frozen=True)
class RecordNote:
    """What ``plan`` says of a record: which plans (0-based) promise more than it, and the walk
    to the best of them when that is the first plan."""

    record: Record
    above: tuple[int, ...]
    walk: tuple[Credit, ...]

    def lines(self) -> list[str]:
        """The note under the plan table."""
        ranks = ", ".join(f"#{i + 1}" for i in self.above)
        r = self.record
        out = [f"{ranks} promise more than the best published run of {r.model} on {r.gpu} "
               f"({r.precision}) we know: {r.mfu():.1%} MFU, {r.source}."]
        if self.walk:
            out.append("What the model credits #1 for, one change at a time from that run "
                       "(docs/planner.md, \"Above the published record\"):")
            width = max(len(c.change) for c in self.walk)
            out += [f"  {c.change:{width}s}  {c.mfu:6.1%}  {c.step_time_s:8.3f} s"
                    for c in self.walk]
        return out


def record_note(plans: list[Scenario], mfus: list[float]) -> RecordNote | None:
    """The note on ``plans`` (fastest first, with their MFUs), or None when no record of their
    kind is known or none beats it."""
    if not plans:
        return None
    record = record_for(plans[0])
    if record is None:
        return None
    best = record.mfu()
    above = tuple(i for i, m in enumerate(mfus) if m > best)
    if not above:
        return None
    walk = tuple(credits(record, plans[0])) if above[0] == 0 else ()
    return RecordNote(record, above, walk)
