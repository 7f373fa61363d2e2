"""What splitting a backward into its input- and weight-gradient halves costs (zero-bubble and
DualPipe schedules: ``I`` and ``W``, Qi et al. 2024 sec. 2).

The weight half runs the same weight-gradient GEMMs a whole backward runs, with the same
shapes and the same fused accumulation into the fp32 gradient (the zero-bubble authors' fork
defers Megatron-LM's ``wgrad_gemm_accum_fp32`` itself, sail-sg/zero-bubble-pipeline-parallelism
``megatron/core/tensor_parallel/layers.py``; Transformer Engine's ``delay_wgrad_compute`` defers
its ``general_gemm`` with ``accumulate`` into ``main_grad``,
``transformer_engine/pytorch/module/linear.py``), so its compute is charged as it is whole
(``compute.weight_gradient_times``). What the split does cost, and this module prices:

* **Cover.** In a whole backward the tensor-parallel collectives of the data gradient run
  beside the weight-gradient GEMMs: Megatron-LM launches the input gradient's all-reduce or
  reduce-scatter asynchronously "before the weight gradient computation" (``layers.py``), and
  Transformer Engine's ``tp_comm_overlap`` hides the reduce-scatter inside the weight-gradient
  GEMM (``ub_bulk_wgrad``). Split, the input half has only its own GEMMs to hide behind:
  Transformer Engine refuses a deferred weight-gradient GEMM with userbuffers
  (``linear.py``: "Delayed weight grad computation is not supported with Userbuffers"), and the
  zero-bubble fork runs the split backward's collectives synchronously (``async_op`` false) and
  does not split where it would lose this overlap ("to overlap grad all-reduce for tensor
  parallel", its zb-h1-quick-start branch). ``lost_cover`` is the exposed time this adds.
* **Memory.** Between the halves a chunk keeps what its weight-gradient GEMMs read: every
  weight GEMM's input ``X`` and output gradient ``dY`` (Transformer Engine's
  ``wgrad_store.put([inputmat_total, grad_output], ...)``; the zero-bubble fork's
  ``WeightGradStore`` the same), and frees the rest of its activations. Qi et al. 2024,
  Table 1: ``32 sbh`` bytes per layer for W against ``sb(34h + 5as)`` for B. Under sequence
  parallelism ``X`` is kept all-gathered and a row-parallel layer's ``dY`` is whole, so a
  deferred W keeps ``sbh (8 + 24/t)`` bytes per layer against ``34 sbh/t`` of activations:
  more, not less (``weight_half_bytes``; the engine swaps one for the other when an input half
  ends, ``deferred_bytes`` gives the closed form's peak).

The CPU harness measured a split backward 27-41% slower than whole (README, "For real"): the
second autograd walk and the saved intermediate gradients of PyTorch's
``stage_backward_input``/``stage_backward_weight`` on kernels too small to hide the host. On a
GPU the host runs ahead of large kernels, and a layer split the deferred way takes the time of
the same layer whole within 1.1% on two H200 machines and -3.2% to +1.6% on two H100s
(benchmarks/gpu_layers.py,
tests/validation/test_layer_kernels.py); that overhead is not charged here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ..model import activations as act
from ..model import routing
from ..model import workload as wl
from ..pipeline.list_schedule import memory_states, repeating_count
from ..pipeline.schedules import Kind, schedule_named, splits_backward
from ..pipeline.stages import chunk_mix, dense_layer_scenario, scenario_layout
from .compute import kernel_times
from .last_scenario import per_scenario
from .layer_comm import tensor_comm

if TYPE_CHECKING:
    import numpy as np

    from ..inputs.scenario import Scenario
    from .cost_model import CostModel


def lost_cover(cm: CostModel) -> float:
    """Exposed seconds a split adds to one layer's backward, per micro-batch: its
    tensor-parallel collectives hidden behind the input half's GEMMs alone
    (``layer_comm.backward_overlap`` with ``split``) rather than the whole backward's."""
    gemms, _ = kernel_times(cm)
    whole = tensor_comm(cm, gemms)[1]
    split = tensor_comm(cm, (gemms[0], max(0.0, gemms[1] - cm.weight_gradients[0])), True)[1]
    return split - whole


def layer_weight_half_bytes(s: Scenario) -> float:
    """Bytes one layer keeps from its input half to its weight half, per micro-batch: each
    weight GEMM's output gradient and input, as the GEMM reads them (``X`` all-gathered under
    sequence parallelism, ``m`` = the micro-batch's tokens); a gated MLP's gate and up
    projections read one input. Qi et al. 2024 Table 1's ``32 sbh`` without tensor
    parallelism."""
    m = s.model
    k = wl.layer_kernels(s)
    elements = sum(g.m * (g.k + g.n) * g.batch * n for g, n in k.gemm_runs)
    if m.ffn_matrices == 3:  # SwiGLU: the gate's and the up projection's input is one tensor
        elements -= routing.routed_rows(s, k.tokens) * m.hidden
        if m.shared_experts:
            elements -= k.tokens * m.hidden
    return elements * wl.GEMM_OPERAND_BYTES[s.training.precision]


def head_weight_half_bytes(s: Scenario) -> float:
    """The output layer's: its input and the logits' gradient, per micro-batch; once more for
    each multi-token prediction module, with its projection's input and output gradient."""
    g, mtp = wl.logits_gemm(s), s.model.mtp_layers
    elements = (1 + mtp) * g.m * (g.k + g.n)
    if mtp:
        proj = wl.mtp_projection_gemm(s)
        elements += mtp * proj.m * (proj.k + proj.n)
    return elements * wl.BYTES[s.training.precision]


def chunk_bytes(s: Scenario) -> list[tuple[float, float]]:
    """(activations kept from forward to backward, bytes kept from input half to weight
    half) of every chunk per micro-batch, counted as ``memory.stage_activation_bytes``
    counts a stage's: its layers, the embedding's dropout mask on a copy's first chunk, the
    output layer's on its last."""
    p, t, m = s.parallel, s.training, s.model
    kinds = (dense_layer_scenario(s) if m.dense_layers else s, s)
    keep = [act.scenario_layer_bytes(kind, p.recompute) for kind in kinds]
    # Without dense first layers both kinds are the scenario itself: its weight half once.
    others = layer_weight_half_bytes(s)
    weight = [layer_weight_half_bytes(kinds[0]) if m.dense_layers else others, others]
    tokens = t.micro_batch * m.seq_len // p.cp
    outer = p.tp if p.sequence_parallel else 1
    layout = scenario_layout(s)
    # Chunks alike (the same layers, both or neither an embedding's or a head's) are sized
    # once: a deep pipeline has dozens of chunks and two or three kinds.
    sized: dict[tuple, tuple[float, float]] = {}
    out = []
    for c, counts in enumerate(chunk_mix(s)):
        kind = (counts, layout.is_first(c), layout.is_last(c))
        if kind not in sized:
            sized[kind] = _chunk_size(s, counts, *kind[1:], keep, weight, tokens, outer)
        out.append(sized[kind])
    return out


def _chunk_size(s: Scenario, counts: tuple[int, int], first: bool, last: bool,
                keep: list[float], weight: list[float], tokens: int, outer: int
                ) -> tuple[float, float]:
    """One chunk's (activations, weight half bytes) per micro-batch (``chunk_bytes``)."""
    m, p = s.model, s.parallel
    acts = sum(n * b for n, b in zip(counts, keep, strict=True))
    half = sum(n * b for n, b in zip(counts, weight, strict=True))
    if first:
        acts += tokens * m.hidden / outer
    if last:
        acts += 4 * tokens * m.vocab / p.tp + 4 * tokens * m.hidden / outer
        half += head_weight_half_bytes(s)
    return acts, half


def deferred_bytes(s: Scenario, stage: int) -> float:
    """What deferred weight halves add to ``stage``'s activation peak, for the closed form:
    the stage's actions walked with each chunk's bytes (a forward keeps its activations, an
    input half swaps them for the weight half's bytes, the weight half or a whole backward
    frees), peak against peak of the same walk without the swap. 0 for a schedule that never
    splits a backward; negative where a weight half keeps less than the activations."""
    p = s.parallel
    if not splits_backward(p.schedule):
        return 0.0
    shape = (p.schedule, p.pp, repeating_count(p.schedule, p.pp, s.microbatches,
                                               p.virtual_stages), p.virtual_stages)
    columns = _held_columns(*shape)[stage]
    if not columns:
        return 0.0
    sizes = _chunk_sizes(s)
    return _deferred_peak(shape, stage, tuple(sizes[c] for c, *_ in columns))


@lru_cache(maxsize=8192)
def _deferred_peak(shape: tuple, stage: int, sizes: tuple[tuple[float, float], ...]) -> float:
    """``deferred_bytes`` of a stage of ``shape`` whose chunks keep ``sizes`` (NOTE:
    remembered: a plan asks it of splits that differ only where these bytes do not, seven
    times per distinct answer for Mixtral 8x7B)."""
    import numpy as np  # here: a step without a split backward starts without numpy

    columns = _held_columns(*shape)[stage]
    swapped = unswapped = np.zeros(len(columns[0][1]))
    # Column by column, each state's bytes summed in chunk order: the same floating-point
    # operations as a sum over the chunks, for every state at once.
    for (_, held, halves, either), (acts, half) in zip(columns, sizes, strict=True):
        swapped = swapped + (held * acts + halves * half)
        unswapped = unswapped + either * acts
    return float(swapped.max() - unswapped.max())


# The memory model asks once per stage: size each scenario's chunks once.
_chunk_sizes = per_scenario(chunk_bytes)




# Per stage: its chunks, then one row per state, one column per chunk (None without states).
StageStates = tuple[tuple[int, ...], "np.ndarray | None", "np.ndarray | None"]
# Per chunk of a stage: the chunk, and its columns of ``StageStates`` as arrays of their own:
# held, halves, and their sum (empty without states).
ChunkColumns = tuple[tuple[int, "np.ndarray", "np.ndarray", "np.ndarray"], ...]


@lru_cache(maxsize=1024)
def _held_columns(name: str, pp: int, m: int, v: int) -> tuple[ChunkColumns, ...]:
    """``_held_states`` by chunk, each column contiguous and ``held + halves`` added once:
    ``deferred_bytes`` reads them for every candidate of the shape, and a column sliced
    out of a state array, or the sum of two, is the same numbers each time."""
    import numpy as np

    out = []
    for chunks, held, halves in _held_states(name, pp, m, v):
        out.append(() if held is None else tuple(
            (c, np.ascontiguousarray(held[:, i]), np.ascontiguousarray(halves[:, i]),
             held[:, i] + halves[:, i]) for i, c in enumerate(chunks)))
    return tuple(out)


@lru_cache(maxsize=1024)
def _held_states(name: str, pp: int, m: int, v: int) -> tuple[StageStates, ...]:
    """Per stage, its chunks and every distinct state its actions pass through, as two
    arrays: per chunk, the micro-batches holding activations (forward run, backward not) and
    those holding a weight half (input half run, weight half not). No states where no
    backward is split. Arrays, as the planner asks for thousands of stages."""
    return tuple(_stage_states(actions)
                 for _, actions in sorted(schedule_named(name).build(pp, m, v).items()))


def _stage_states(actions: list) -> StageStates:
    actions = [a for a in actions if a.kind is not Kind.OVERLAP_F_B]
    chunks = sorted({a.chunk for a in actions})
    if not any(a.kind is Kind.BACKWARD_INPUT for a in actions):
        return tuple(chunks), None, None
    import numpy as np

    ordered = sorted(set(memory_states(actions)))
    return (tuple(chunks), np.array([h for h, _ in ordered], dtype=float),
            np.array([w for _, w in ordered], dtype=float))
