"""A function of a scenario computed once while the same scenario is asked again.

The memory model asks for each pipeline stage in turn, and the planner for thousands of
scenarios, so what a scenario's stages share (its layers' activation bytes, its chunks' sizes)
is sized once per scenario. Scenarios are not hashable, so the last one is kept, by identity
(it cannot be freed, and its address reused, while it is kept).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

T = TypeVar("T")


def per_scenario(fn: Callable[[Scenario], T]) -> Callable[[Scenario], T]:
    """``fn``, remembering its value for the scenario it was last called with."""
    last: dict = {}

    @wraps(fn)
    def sized(s: Scenario) -> T:
        if last.get("scenario") is not s:
            last.update(scenario=s, value=fn(s))
        return last["value"]

    return sized
