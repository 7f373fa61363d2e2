"""The engine's action lists of a shape, with their sends and receives, built once per shape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from itertools import chain, compress
from operator import itemgetter

from ..pipeline.schedules import Kind, with_communication

_CHUNK, _KIND = itemgetter(0), itemgetter(1)  # an Action's chunk and kind


@lru_cache(maxsize=8)  # a few shapes: the 1T interleaved step's lists are ~30 MB
def lowered_lists(build: Callable[[int, int, int], dict], pp: int, m: int, v: int,
                  chunks: int, stages: tuple[int, ...], copies: int
                  ) -> tuple[tuple, dict[int, int], frozenset[Kind]]:
    """Every rank's actions with their sends and receives, how many backwards each chunk
    runs (its weight gradients are complete after the last of them: m, or fewer where the
    chunks hold several copies of the model) and the kinds of action among them. NOTE: once
    per shape: the shortcuts and the planner build engines of one shape again and again."""
    lists = build(pp, m, v)
    own = list(chain.from_iterable(lists.values()))  # (counted at C speed: 10^5 actions)
    weighted = map({Kind.BACKWARD, Kind.BACKWARD_WEIGHT}.__contains__, map(_KIND, own))
    passes = Counter(compress(map(_CHUNK, own), weighted))
    lowered = with_communication(lists, chunks, stages, copies)
    kinds = frozenset(map(_KIND, chain.from_iterable(lowered.values())))
    return tuple((r, tuple(actions)) for r, actions in lowered.items()), dict(passes), kinds
