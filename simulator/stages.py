"""How a model's layers are spread over pipeline stages and their virtual chunks."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from .schedules import schedule_named

if TYPE_CHECKING:
    from .scenario import Scenario


def even_split(total: int, parts: int) -> list[int]:
    """``total`` items in ``parts`` groups as evenly as possible; the first groups get the extra."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@lru_cache(maxsize=256)
def chunk_stages(pp: int, v: int, placement: str = "loop") -> tuple[int, ...]:
    """The pipeline stage each of the ``pp * v`` model chunks runs on.

    ``loop``: chunk ``c`` on stage ``c % pp`` (Megatron-LM's interleaved placement). ``v``: down
    the stages and back up, ``0..pp-1`` then ``pp-1..0`` (PyTorch's
    ``generate_stage_to_rank_mapping(style="v")``, torch/distributed/pipelining/_utils.py): the
    first and last chunks share stage 0 and consecutive chunks at a turn share a stage, so
    that hand-over needs no send (ZB-V, DualPipeV).
    """
    if placement == "loop":
        return tuple(c % pp for c in range(pp * v))
    if placement == "v":
        return tuple(c % pp if (c // pp) % 2 == 0 else pp - 1 - c % pp for c in range(pp * v))
    raise ValueError(f"unknown chunk placement {placement!r} (valid: loop, v)")


def scenario_chunk_stages(s: Scenario) -> tuple[int, ...]:
    """``chunk_stages`` as the scenario's schedule places its chunks."""
    return chunk_stages(*_placement(s))


def chunks_of_stage(s: Scenario, stage: int) -> list[int]:
    """The chunks ``stage`` runs, in model order."""
    return [c for c, st in enumerate(scenario_chunk_stages(s)) if st == stage]


def head_stage(s: Scenario) -> int:
    """The stage that runs the last chunk (output layer and loss): ``pp - 1``, or 0 in a V."""
    return scenario_chunk_stages(s)[-1]


def chunk_layers(s: Scenario) -> list[int]:
    """Layers of each model chunk, in model order: ``pp * virtual_stages`` entries.

    Chunks are placed on stages by the schedule (``chunk_stages``). Per-stage
    ``stage_layers`` are split evenly over that stage's chunks.
    """
    return list(_chunk_layers(*_layout(s)))


def stage_layers(s: Scenario) -> list[int]:
    """Layers held by each pipeline stage (all its chunks together)."""
    return list(_stage_layers(*_layout(s)))


def chunk_mix(s: Scenario) -> list[tuple[int, int]]:
    """Each chunk's layers as (dense, other): how many are among the model's ``dense_layers``
    first ones (DeepSeek's first_k_dense_replace), chunks in model order."""
    out, start = [], 0
    for n in chunk_layers(s):
        dense = min(max(s.model.dense_layers - start, 0), n)
        out.append((dense, n - dense))
        start += n
    return out


def stage_mix(s: Scenario) -> list[tuple[int, int]]:
    """``chunk_mix`` summed over each stage's chunks: (dense, other) layers per stage."""
    owner = scenario_chunk_stages(s)
    mix = chunk_mix(s)
    return [(sum(d for (d, _), st in zip(mix, owner, strict=True) if st == stage),
             sum(n for (_, n), st in zip(mix, owner, strict=True) if st == stage))
            for stage in range(s.parallel.pp)]


def dense_layer_scenario(s: Scenario) -> Scenario:
    """``s`` as its dense first layers see it (``ModelSpec.dense_layer_spec``): the per-layer
    costs of those layers come from it."""
    return replace(s, model=s.model.dense_layer_spec())


def _placement(s: Scenario) -> tuple[int, int, str]:
    p = s.parallel
    return p.pp, p.virtual_stages, schedule_named(p.schedule).placement


def _layout(s: Scenario) -> tuple[int, int, int, tuple[int, ...] | None, str]:
    p = s.parallel
    given = tuple(p.stage_layers) if p.stage_layers is not None else None
    return s.model.layers, p.pp, p.virtual_stages, given, _placement(s)[2]


# Cached: the memory model and the closed form ask for every stage of every candidate split.
@lru_cache(maxsize=4096)
def _chunk_layers(layers: int, pp: int, v: int, given: tuple[int, ...] | None,
                  placement: str = "loop") -> tuple[int, ...]:
    if given is None:
        return tuple(even_split(layers, pp * v))
    if len(given) == pp * v:
        return given
    per_stage = [even_split(n, v) for n in given]
    taken = [0] * pp  # each stage's chunks take its layers in model order
    out = []
    for stage in chunk_stages(pp, v, placement):
        out.append(per_stage[stage][taken[stage]])
        taken[stage] += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def _stage_layers(layers: int, pp: int, v: int, given: tuple[int, ...] | None,
                  placement: str = "loop") -> tuple[int, ...]:
    chunks = _chunk_layers(layers, pp, v, given, placement)
    owner = chunk_stages(pp, v, placement)
    return tuple(sum(n for n, st in zip(chunks, owner, strict=True) if st == stage)
                 for stage in range(pp))
