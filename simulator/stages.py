"""How a model's layers are spread over pipeline stages and their virtual chunks."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scenario import Scenario


def even_split(total: int, parts: int) -> list[int]:
    """``total`` items in ``parts`` groups as evenly as possible; the first groups get the extra."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def chunk_layers(s: Scenario) -> list[int]:
    """Layers of each model chunk, in model order: ``pp * virtual_stages`` entries.

    Chunk ``c`` runs on stage ``c % pp`` (Megatron-LM's interleaved placement). Per-stage
    ``stage_layers`` are split evenly over that stage's chunks.
    """
    return list(_chunk_layers(*_layout(s)))


def stage_layers(s: Scenario) -> list[int]:
    """Layers held by each pipeline stage (all its chunks together)."""
    return list(_stage_layers(*_layout(s)))


def _layout(s: Scenario) -> tuple[int, int, int, tuple[int, ...] | None]:
    p = s.parallel
    given = tuple(p.stage_layers) if p.stage_layers is not None else None
    return s.model.layers, p.pp, p.virtual_stages, given


# Cached: the memory model and the closed form ask for every stage of every candidate split.
@lru_cache(maxsize=4096)
def _chunk_layers(layers: int, pp: int, v: int, given: tuple[int, ...] | None
                  ) -> tuple[int, ...]:
    if given is None:
        return tuple(even_split(layers, pp * v))
    if len(given) == pp * v:
        return given
    per_stage = [even_split(n, v) for n in given]
    return tuple(per_stage[c % pp][c // pp] for c in range(pp * v))


@lru_cache(maxsize=4096)
def _stage_layers(layers: int, pp: int, v: int, given: tuple[int, ...] | None
                  ) -> tuple[int, ...]:
    chunks = _chunk_layers(layers, pp, v, given)
    return tuple(sum(chunks[stage::pp]) for stage in range(pp))
