"""How a model's layers are spread over pipeline stages and their virtual chunks."""

from __future__ import annotations

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
    pp, v = s.parallel.pp, s.parallel.virtual_stages
    given = s.parallel.stage_layers
    if given is None:
        return even_split(s.model.layers, pp * v)
    if len(given) == pp * v:
        return list(given)
    per_stage = [even_split(n, v) for n in given]
    return [per_stage[c % pp][c // pp] for c in range(pp * v)]


def stage_layers(s: Scenario) -> list[int]:
    """Layers held by each pipeline stage (all its chunks together)."""
    pp = s.parallel.pp
    chunks = chunk_layers(s)
    return [sum(chunks[stage::pp]) for stage in range(pp)]
