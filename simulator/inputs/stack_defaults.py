"""A stack's default that depends on the split: by ZeRO stage, by pipeline, by schedule, by
sequence parallelism.

``frameworks.DEFAULTS`` gives a field's default under each stack as a value, or as one of these
where the stack's own default depends on the split the scenario sets; each says how
docs/frameworks.md prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Split(NamedTuple):
    """What of a scenario's split a stack's default may depend on."""

    zero: int
    pipelined: bool
    interleaved: bool = False
    sequence_parallel: bool = False


@dataclass(frozen=True, slots=True)
class ByZero:
    """A default that depends on the ZeRO stage as configured: ``values[stage]``."""

    values: tuple[Any, Any, Any, Any]

    def pick(self, split: Split) -> Any:
        return self.values[split.zero]

    def __str__(self) -> str:
        runs: list[tuple[Any, list[int]]] = []
        for stage, value in enumerate(self.values):
            if runs and runs[-1][0] == value:
                runs[-1][1].append(stage)
            else:
                runs.append((value, [stage]))
        return ", ".join(f"{show(v)} (zero {s[0]}{'-' + str(s[-1]) if len(s) > 1 else ''})"
                         for v, s in runs)


@dataclass(frozen=True, slots=True)
class ByPipeline:
    """A default that depends on whether there is a pipeline (``pp > 1``)."""

    single: Any
    pipelined: Any

    def pick(self, split: Split) -> Any:
        return self.pipelined if split.pipelined else self.single

    def __str__(self) -> str:
        return f"{show(self.single)} (pp 1), {show(self.pipelined)} (pp > 1)"


@dataclass(frozen=True, slots=True)
class BySchedule:
    """A default that depends on whether the schedule is Megatron-LM's interleaved one."""

    other: Any
    interleaved: Any

    def pick(self, split: Split) -> Any:
        return self.interleaved if split.interleaved else self.other

    def __str__(self) -> str:
        return f"{show(self.interleaved)} (interleaved), {show(self.other)} (other schedules)"


@dataclass(frozen=True, slots=True)
class BySequenceParallel:
    """A default that depends on whether sequence parallelism is on."""

    off: Any
    on: Any

    def pick(self, split: Split) -> Any:
        return self.on if split.sequence_parallel else self.off

    def __str__(self) -> str:
        return f"{show(self.off)} (without sequence parallelism), {show(self.on)} (with it)"


CONDITIONAL = (ByZero, ByPipeline, BySchedule, BySequenceParallel)


def show(value: Any) -> str:
    """A default as docs/frameworks.md's table prints it."""
    if value is None:
        return "`null`"
    if isinstance(value, list):
        return f"`[{', '.join(value)}]`"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"
