"""How a model's layers are spread over pipeline stages and their virtual chunks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from .schedules import schedule_named

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario


def even_split(total: int, parts: int) -> list[int]:
    """``total`` items in ``parts`` groups as evenly as possible; the first groups get the extra."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass(frozen=True)
class ChunkLayout:
    """Where a schedule's model chunks sit and which model they make up.

    ``stages[c]`` is the pipeline stage (rank) of chunk ``c``. The chunks hold ``copies``
    copies of the model, each ``per_copy`` chunks long, in model order: chunk ``c`` is part
    ``c % per_copy`` of copy ``c // per_copy``. A micro-batch runs through one copy, forward
    from its first chunk to its last (which runs the output layer and the loss) and backward
    the reverse way; the hand-over from ``c`` to ``c + 1`` exists only inside a copy.
    """

    stages: tuple[int, ...]
    copies: int = 1

    @cached_property
    def per_copy(self) -> int:
        """Chunks in one copy of the model: the parts its layers are split into."""
        return len(self.stages) // self.copies

    def part(self, chunk: int) -> int:
        """Which part of the model ``chunk`` holds, 0 (embedding) to ``per_copy - 1`` (head)."""
        return chunk % self.per_copy

    def is_first(self, chunk: int) -> bool:
        return self.part(chunk) == 0

    def is_last(self, chunk: int) -> bool:
        return self.part(chunk) == self.per_copy - 1

    def first_of(self, chunk: int) -> int:
        """The first chunk (the embedding) of ``chunk``'s copy."""
        return chunk - self.part(chunk)

    def of_stage(self, stage: int) -> list[int]:
        """The chunks ``stage`` runs, in model order."""
        return list(self._by_stage.get(stage, ()))

    def firsts_of(self, stage: int) -> list[int]:
        """The chunks of ``stage`` that begin a copy of the model, in model order."""
        return list(self._ends_by_stage[0].get(stage, ()))

    def lasts_of(self, stage: int) -> list[int]:
        """The chunks of ``stage`` that end a copy of the model, in model order."""
        return list(self._ends_by_stage[1].get(stage, ()))

    @cached_property
    def _ends_by_stage(self) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
        # NOTE: built once per layout, as ``_by_stage``: the memory check and the planner's
        # bound ask a stage's embeddings and heads of every candidate (250,000 scans of the
        # stage's chunks for Mixtral 8x7B on 256 GPUs).
        return ({st: tuple(c for c in chunks if self.is_first(c))
                 for st, chunks in self._by_stage.items()},
                {st: tuple(c for c in chunks if self.is_last(c))
                 for st, chunks in self._by_stage.items()})

    @cached_property
    def _by_stage(self) -> dict[int, tuple[int, ...]]:
        # NOTE: built once per layout: the memory model and the closed form ask for every
        # stage's chunks of every scenario the planner tries (a scan each was 8% of a plan).
        found: dict[int, list[int]] = {}
        for c, st in enumerate(self.stages):
            found.setdefault(st, []).append(c)
        return {st: tuple(chunks) for st, chunks in found.items()}


@lru_cache(maxsize=256)
def chunk_layout(pp: int, v: int, placement: str = "loop") -> ChunkLayout:
    """The chunks of a ``placement`` on ``pp`` stages with ``v`` chunks each.

    ``loop``: one model in ``pp * v`` chunks, chunk ``c`` on stage ``c % pp`` (Megatron-LM's
    interleaved placement). ``v``: one model down the stages and back up, ``0..pp-1`` then
    ``pp-1..0`` (PyTorch's ``generate_stage_to_rank_mapping(style="v")``,
    torch/distributed/pipelining/_utils.py): the first and last chunks share stage 0 and
    consecutive chunks at a turn share a stage, so that hand-over needs no send (ZB-V,
    DualPipeV). ``dual``: two copies of the model, each in ``pp`` chunks, the first down the
    stages (chunk ``c`` on stage ``c``), the second up them (its part ``k``, chunk ``pp + k``,
    on stage ``pp - 1 - k``), so that stage r holds part r of one copy and part ``pp - 1 - r``
    of the other and the embedding and the head sit on both end stages (DualPipe, DeepSeek-AI
    2024, sec. 3.2.1; deepseek-ai/DualPipe dualpipe/dualpipe.py, whose rank r runs
    ``modules[0]`` forward and ``modules[1]`` in reverse); ``v`` must be 2.
    """
    if placement == "loop":
        return ChunkLayout(tuple(c % pp for c in range(pp * v)))
    if placement == "v":
        return ChunkLayout(tuple(c % pp if (c // pp) % 2 == 0 else pp - 1 - c % pp
                                 for c in range(pp * v)))
    if placement == "dual":
        if v != 2:
            raise ValueError(f"the dual placement holds 2 chunks per stage (got {v})")
        return ChunkLayout(chunk_layout(pp, 2, "v").stages, copies=2)
    raise ValueError(f"unknown chunk placement {placement!r} (valid: loop, v, dual)")


def chunk_stages(pp: int, v: int, placement: str = "loop") -> tuple[int, ...]:
    """The pipeline stage each of the ``pp * v`` model chunks runs on (``chunk_layout``)."""
    return chunk_layout(pp, v, placement).stages


def scenario_layout(s: Scenario) -> ChunkLayout:
    """``chunk_layout`` as the scenario's schedule places its chunks."""
    return chunk_layout(*_placement(s))


def scenario_chunk_stages(s: Scenario) -> tuple[int, ...]:
    """``chunk_stages`` as the scenario's schedule places its chunks."""
    return scenario_layout(s).stages


def chunks_of_stage(s: Scenario, stage: int) -> list[int]:
    """The chunks ``stage`` runs, in model order."""
    return scenario_layout(s).of_stage(stage)


def head_stage(s: Scenario) -> int:
    """The stage that runs the last chunk (output layer and loss): ``pp - 1``, or 0 in a V and
    in the dual placement, whose first copy's head is on ``pp - 1`` (``head_chunks``)."""
    return scenario_layout(s).stages[-1]


def embedding_chunks(s: Scenario, stage: int) -> list[int]:
    """The chunks of ``stage`` that begin a copy of the model (hold an input embedding)."""
    return scenario_layout(s).firsts_of(stage)


def head_chunks(s: Scenario, stage: int) -> list[int]:
    """The chunks of ``stage`` that end a copy of the model (output layer and loss)."""
    return scenario_layout(s).lasts_of(stage)


def head_apart(s: Scenario, chunk: int) -> bool:
    """Whether the head ``chunk`` sits on another stage than its copy's embedding (a tied
    output layer then keeps its own copy of the table)."""
    layout = scenario_layout(s)
    return layout.stages[chunk] != layout.stages[layout.first_of(chunk)]


def microbatch_share(s: Scenario) -> float:
    """The share of micro-batches that run through each chunk: 1, or ``1/copies`` when the
    chunks hold several copies of the model, each running its own micro-batches."""
    return 1 / scenario_layout(s).copies


def chunk_layers(s: Scenario) -> list[int]:
    """Layers of each model chunk, in chunk order: ``pp * virtual_stages`` entries.

    Chunks are placed on stages by the schedule (``chunk_layout``). Given ``stage_layers``
    are per part of a copy of the model (``pp * virtual_stages`` entries of one model,
    ``pp`` of each of the dual placement's two copies, alike in both), or else per stage,
    split evenly over that stage's chunks.
    """
    return list(_chunk_layers(*_layout(s)))


def stage_layers(s: Scenario) -> list[int]:
    """Layers held by each pipeline stage (all its chunks together)."""
    return list(_stage_layers(*_layout(s)))


def chunk_mix(s: Scenario) -> list[tuple[int, int]]:
    """Each chunk's layers as (dense, other): how many are among the model's ``dense_layers``
    first ones (DeepSeek's first_k_dense_replace), chunks in chunk order; every copy of the
    model (``ChunkLayout.copies``) starts with its own dense layers, and its last chunk also
    runs the layers of its ``mtp_layers`` multi-token prediction modules, each like the
    model's last (Megatron-Core's pipeline layout "...mL": the MTP module before the loss)."""
    return list(_chunk_mix(*_layout(s), s.model.dense_layers, s.model.mtp_layers))


def stage_mix(s: Scenario) -> list[tuple[int, int]]:
    """``chunk_mix`` summed over each stage's chunks: (dense, other) layers per stage."""
    return list(_stage_mix(*_layout(s), s.model.dense_layers, s.model.mtp_layers))


@lru_cache(maxsize=4096)
def _chunk_mix(layers: int, pp: int, v: int, given: tuple[int, ...] | None, placement: str,
               dense_layers: int, mtp: int = 0) -> tuple[tuple[int, int], ...]:
    layout = chunk_layout(pp, v, placement)
    out, start = [], 0
    for c, n in enumerate(_chunk_layers(layers, pp, v, given, placement)):
        if layout.is_first(c):
            start = 0
        dense = min(max(dense_layers - start, 0), n)
        out.append((dense, n - dense + (mtp if layout.is_last(c) else 0)))
        start += n
    return tuple(out)


# Cached, as _chunk_layers: the memory model asks for every stage, often.
@lru_cache(maxsize=4096)
def _stage_mix(layers: int, pp: int, v: int, given: tuple[int, ...] | None, placement: str,
               dense_layers: int, mtp: int = 0) -> tuple[tuple[int, int], ...]:
    totals = [[0, 0] for _ in range(pp)]
    owner = chunk_layout(pp, v, placement).stages
    for (dense, other), stage in zip(_chunk_mix(layers, pp, v, given, placement, dense_layers,
                                                mtp), owner, strict=True):
        totals[stage][0] += dense
        totals[stage][1] += other
    return tuple((dense, other) for dense, other in totals)


def dense_layer_scenario(s: Scenario) -> Scenario:
    """``s`` as its dense first layers see it (``ModelSpec.dense_layer_spec``): the per-layer
    costs of those layers come from it."""
    return replace(s, model=s.model.dense_layer_spec())


def _placement(s: Scenario) -> tuple[int, int, str]:
    p = s.parallel
    return p.pp, p.virtual_stages, schedule_named(p.schedule).placement


def _layout(s: Scenario) -> tuple[int, int, int, tuple[int, ...] | None, str]:
    p = s.parallel
    placement = _placement(s)[2]
    given = tuple(p.stage_layers) if p.stage_layers is not None else None
    if given is None and p.layer_split == "ends_as_layers":
        given = ends_as_layers(s.model.layers, chunk_layout(p.pp, p.virtual_stages,
                                                            placement).per_copy)
    return s.model.layers, p.pp, p.virtual_stages, given, placement


def ends_as_layers(layers: int, parts: int) -> tuple[int, ...] | None:
    """The layers of one copy of the model over ``parts`` chunks with the embedding and the
    output layer counted as a layer each: ``layers + 2`` spread as evenly as possible, the first
    chunks taking the remainder, and one taken off the first and the last chunk (torchtitan's
    ``_generate_llm_fqn_per_model_part`` with weights 1, torchtitan/distributed/
    pipeline_parallel.py; Megatron-Core's account-for-embedding/loss split where ``layers + 2``
    divides evenly). None with one chunk, and where a chunk would get no share
    (``layers + 2 < parts``: ``rules.py`` refuses it)."""
    if parts == 1 or layers + 2 < parts:
        return None
    spread = even_split(layers + 2, parts)
    spread[0] -= 1
    spread[-1] -= 1
    return tuple(spread)


# Cached: the memory model and the closed form ask for every stage of every candidate split.
@lru_cache(maxsize=4096)
def _chunk_layers(layers: int, pp: int, v: int, given: tuple[int, ...] | None,
                  placement: str = "loop") -> tuple[int, ...]:
    layout = chunk_layout(pp, v, placement)
    if given is None or len(given) == layout.per_copy:
        parts = given or even_split(layers, layout.per_copy)
        return tuple(parts[layout.part(c)] for c in range(pp * v))
    per_stage = [even_split(n, v) for n in given]
    taken = [0] * pp  # each stage's chunks take its layers in model order
    out = []
    for stage in layout.stages:
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
