"""A function of a scenario computed once while the same scenario is asked again.

The memory model asks for each pipeline stage in turn, and the planner for thousands of
scenarios, so what a scenario's stages share (its layers' activation bytes, its chunks' sizes)
is sized once per scenario. Scenarios are not hashable, so the last one is kept, by identity
(it cannot be freed, and its address reused, while it is kept).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from operator import itemgetter
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


class Same:
    """An object as part of a cache key by identity: a spec kept whole (a cluster holds
    dicts, so it has no value hash); the key keeps it alive, so its id is not reused while
    the cache lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj


def parallel_key(s: Scenario, ignored: frozenset[str]) -> tuple:
    """The scenario's parallel section as a hashable tuple of (field, value), but for the
    ``ignored`` fields. The memory check, its verdict and the layers' costs each ask it of
    the same (frozen) section with fields of their own left out: the last section's pairs
    are made once, and each set of fields left out picks from them."""
    p = s.parallel
    if _LAST[0] is not p:
        # kept alive: its id is not reused meanwhile
        _LAST[:] = p, tuple(p.__dict__), tuple((k, tuple(v) if isinstance(v, list) else v)
                                               for k, v in p.__dict__.items())
    _, names, pairs = _LAST
    pick = _PICKS.get((names, ignored))
    if pick is None:
        kept = [i for i, (k, _) in enumerate(pairs) if k not in ignored]
        pick = _PICKS[names, ignored] = (
            (lambda items: ()) if not kept else
            (lambda items, i=kept[0]: (items[i],)) if len(kept) == 1 else itemgetter(*kept))
    return pick(pairs)


_LAST: list = [None, (), ()]  # the last parallel section asked, its fields, its pairs
_PICKS: dict = {}  # by (fields, fields left out): what picks the rest of the pairs
