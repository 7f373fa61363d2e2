"""Exposed tensor-, context- and expert-parallel communication of one layer and micro-batch
(the expert all-to-alls' own costs: ``token_dispatch.py``).

Which collectives run, how many and how large follows Megatron-LM / Megatron-Core; the message
sizes come from ``workload`` (``tp_collective_bytes``, ``expert_dispatch_bytes``) and
``context_messages`` (``cp_kv_block_bytes``), their times from the alpha-beta forms of
``topologies.network`` over the tiers each group spans. The analytic estimator and the engine
both charge these per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustersim.topologies import network as net
from clustersim.topologies.collective_algorithms import Ring
from clustersim.topologies.collective_registry import collective_named

from ..inputs.placement import context_levels
from ..model import context_messages as cpm
from ..model import workload as wl
from ..pipeline.overlap import exposed_beside
from . import compute
from .compute import tp_overlaps
from .token_dispatch import expert_comm

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario
    from .cost_model import CostModel


@dataclass(frozen=True, slots=True)
class Collectives:
    """``forward`` and ``backward`` collectives of one ``kind`` on ``nbytes`` each, per layer
    (recomputation not included)."""

    kind: str  # "allreduce" | "allgather" | "reduce_scatter"
    nbytes: float
    forward: int
    backward: int
    # Of the backward ones, how many Megatron-LM runs beside the column-parallel layers' GEMMs
    # by default (``backward_overlap``).
    backward_hidden: int = 0


def tp_collectives(s: Scenario) -> tuple[Collectives, ...]:
    """Tensor-parallel collectives of one layer (megatron/core/tensor_parallel/layers.py and
    mappings.py).

    Without sequence parallelism each sublayer (attention, MLP) all-reduces its row-parallel
    output in forward and its column-parallel input gradient in backward: 2 and 2. With it,
    forward all-gathers the input before the column-parallel GEMM (QKV, FC1) and
    reduce-scatters after the row-parallel one (proj, FC2); backward all-gathers the output
    gradient (the reduce-scatter's transpose), reduce-scatters the input gradient, and
    all-gathers the input *again* for the weight gradient
    (LinearWithGradAccumulationAndAsyncCommunication.backward keeps only the local shard): per
    sublayer 2 collectives forward, 3 backward, so backward moves 1.5x the forward's bytes;
    where the layers keep their gathered input (``ParallelSpec.gathered_inputs_kept``:
    torchtitan's DTensor plan) nothing is gathered again, 2 and 2.
    An MoE layer's MLP instead all-gathers the dispatched tokens across tp after the
    all-to-all and reduce-scatters them before the combine (MoEAlltoAllTokenDispatcher); the
    gathered tokens are kept for backward, so those two only transpose: 1 and 1 each way;
    the alltoall dispatcher gathers the routing probabilities in a collective of their own
    (``dispatch_postprocess``: ``global_probs = gather_from_sequence_parallel_region``), whose
    backward reduce-scatters their gradients; whole experts (``expert_tp`` 1, parallel folding)
    take each rank's own tokens, no gather.
    Shared experts beside them are a dense MLP of their own (Megatron-Core's SharedExpertMLP,
    column- and row-parallel linears): one more sublayer's gather and reduce-scatter. MLA's
    attention gathers its latents, not the hidden state (``latent_collectives``); without
    sequence parallelism its backward all-reduces the latents' gradients, the up-projections'
    inputs, one collective each, in place of the hidden state's.

    Under fp8 every all-gather of a dense sublayer carries Transformer Engine's FP8 copy, one
    byte an element: the layer norm's output is written in FP8 and gathered so, forward and
    again for the weight gradient (transformer_engine/pytorch/module/layernorm_linear.py,
    ``gather_along_first_dim(ln_out, ...)`` after the FP8 norm), and a row-parallel layer's
    output gradient is cast on the rank's shard before its gather (base.py,
    ``grad_output_preprocess``). The reduce-scatters carry the GEMMs' bf16 outputs and input
    gradients, and the MoE dispatcher's gathers its bf16 tokens.
    """
    if s.parallel.tp == 1:
        return ()
    x = wl.tp_collective_bytes(s)
    m = s.model
    rerun = int("mlp" in s.parallel.recomputed and m.experts == 1)  # the MLP's forward again
    if not s.parallel.sequence_parallel:
        if m.mla:  # the up-projections' input gradients are the latents', one each; the
            # RoPE key's is left partial (no gather to transpose in multi_latent_attention.py)
            query, kv, _ = wl.latent_gather_bytes(s)
            return (Collectives("allreduce", x, 2, 1 + rerun, backward_hidden=1),
                    *(Collectives("allreduce", b, 0, 1, backward_hidden=1) for b in (query, kv)))
        return (Collectives("allreduce", x, 2, 2 + rerun, backward_hidden=2),)
    operand = wl.GEMM_OPERAND_BYTES[s.training.precision] / wl.BYTES[s.training.precision]
    # Inputs kept as gathered (``gathered_inputs_kept``, torchtitan) are not gathered again;
    # MoE layers keep Megatron's re-gathers.
    again = 0 if s.parallel.gathered_inputs_kept and m.experts == 1 else 1
    # attention (unless latent), the dense MLP or the shared experts
    n = int(not m.mla) + (1 if m.experts == 1 else int(m.shared_experts > 0))
    out = [Collectives("allgather", x * operand, n, n * (1 + again) + rerun,
                       backward_hidden=n * again),
           Collectives("reduce_scatter", x, n, n + rerun, backward_hidden=n)] if n else []
    if m.mla:
        out += latent_collectives(s, x, operand, again)
    if m.experts > 1 and s.parallel.etp > 1:  # whole experts (expert_tp 1) gather nothing
        experts = wl.expert_tp_bytes(s)
        out += [Collectives("allgather", experts, 1, 1),
                Collectives("reduce_scatter", experts, 1, 1)]
        if s.parallel.moe_dispatcher == "alltoall":  # the probabilities, gathered apart
            probs = s.parallel.etp * wl.expert_probs_bytes(s)
            out += [Collectives("allgather", probs, 1, 0),
                    Collectives("reduce_scatter", probs, 0, 1)]
    return tuple(out)


def latent_collectives(s: Scenario, x: float, operand: float, again: int) -> list[Collectives]:
    """MLA's attention under sequence parallelism (``latent.py``), a collective a tensor as
    Megatron-Core runs them (multi_latent_attention.py): forward all-gathers each latent an
    up-projection reads and the shared RoPE key (``workload.latent_gather_bytes``) and
    reduce-scatters the output projection's output; backward all-gathers the output gradient,
    reduce-scatters the latents' and the RoPE key's gradients, the latents' beside the
    up-projections' weight gradients, and gathers the latents again for them beside their
    data gradients, as a dense column-parallel layer does (``x`` the hidden state's bytes,
    ``operand`` the gathered copy's share of them: ``tp_collectives``). ``mla_up_proj``
    recomputation re-runs the up-projections, their gathers included (``qkv_up_checkpoint``;
    the RoPE key is gathered before it): one gather more each, exposed."""
    *latents, rope = wl.latent_gather_bytes(s)
    rerun = int("mla_up_proj" in s.parallel.recomputed)
    ups = [c for nbytes in latents for c in (
        Collectives("allgather", nbytes * operand, 1, again + rerun, backward_hidden=again),
        Collectives("reduce_scatter", nbytes, 0, 1, backward_hidden=1))]
    return [*ups, Collectives("allgather", rope, 1, 0), Collectives("reduce_scatter", rope, 0, 1),
            Collectives("reduce_scatter", x, 1, 0),
            Collectives("allgather", x * operand, 0, 1)]


def layer_comm(cm: CostModel, gemms: tuple[float, float],
               attention: tuple[float, float]) -> tuple[float, float]:
    """Exposed TP/CP/EP communication of one layer, (forward, backward), given its GEMM and
    attention-core times each way (backward's including recomputation)."""
    tp_fwd, tp_bwd = tensor_comm(cm, gemms)
    other_fwd, other_bwd = other_comm(cm, attention)
    return tp_fwd + other_fwd, tp_bwd + other_bwd


def other_comm(cm: CostModel, attention: tuple[float, float]) -> tuple[float, float]:
    """Exposed context- and expert-parallel communication of one layer, (forward, backward)."""
    parts = (context_comm(cm, attention), expert_comm(cm))
    return sum(f for f, _ in parts), sum(b for _, b in parts)


def _rerun(cm: CostModel) -> int:
    """1 when full recomputation re-runs the layer's forward (collectives too) in backward."""
    return 1 if cm.s.parallel.recompute == "full" else 0


def _one(cm: CostModel, c: Collectives) -> float:
    """One of ``c``'s collectives over the TP group."""
    return collective_named(c.kind).time(cm.tp, c.nbytes)


def tensor_comm_total(cm: CostModel) -> tuple[float, float]:
    """The layer's TP collectives (``tp_collectives``), hidden or not, (forward, backward):
    backward adds the forward's again when full recompute re-runs it."""
    forward = backward = 0.0
    for c in tp_collectives(cm.s):
        forward += c.forward * _one(cm, c)
        backward += c.backward * _one(cm, c)
    return forward, backward + _rerun(cm) * forward


def backward_overlap(cm: CostModel, split: bool = False) -> tuple[float, float]:
    """(collectives, GEMMs they run beside) of Megatron-LM's default backward overlap, per
    layer and micro-batch (LinearWithGradAccumulationAndAsyncCommunication.backward in
    megatron/core/tensor_parallel/layers.py, on whenever tp > 1). A column-parallel layer
    launches its input-gradient all-reduce and computes its weight gradient meanwhile; with
    sequence parallelism it launches the all-gather of its input beside the data-gradient
    GEMM and the input gradient's reduce-scatter beside the weight-gradient GEMM. The
    row-parallel layers' collectives (the output gradient's all-gather) and a full
    recompute's re-run forward stay exposed.

    ``split``: the input half of a split backward (``split_backward.py``) has no
    weight-gradient GEMM to run beside, so only the all-gathers keep their cover, the
    data-gradient GEMM (Transformer Engine's ``delay_wgrad_compute`` stores the gathered
    input for the deferred GEMM, ``wgrad_store.put([inputmat_total, grad_output], ...)`` in
    transformer_engine/pytorch/module/linear.py)."""
    if not cm.s.parallel.tp_backward_overlap:
        return 0.0, 0.0
    kept = ("allgather",) if split else ("allgather", "reduce_scatter", "allreduce")
    hidden = sum(c.backward_hidden * _one(cm, c) for c in tp_collectives(cm.s) if c.kind in kept)
    if hidden == 0:
        return 0.0, 0.0
    dgrad, wgrad = compute.column_backward_times(cm)
    if split:
        return hidden, dgrad
    p = cm.s.parallel  # the data-gradient GEMM covers the re-gather, where there is one
    regathers = p.sequence_parallel and not p.gathered_inputs_kept
    return hidden, wgrad + (dgrad if regathers else 0.0)


def backward_hide(cm: CostModel, backward_gemms: float, split: bool = False) -> float:
    """The compute the backward's (or a split backward's input half's) TP collectives run
    beside: all its GEMMs under ``tp_comm_overlap``; else Megatron-LM's default
    (``backward_overlap``), counted only up to the collectives it hides, so that no window
    left over hides the exposed ones."""
    if tp_overlaps(cm):
        return backward_gemms
    hidden, window = backward_overlap(cm, split)
    return min(hidden, window)


def _ring(kind: str) -> Ring:
    """The ring the registry declares for TP collective ``kind`` (``collective_registry``):
    all-gather's and reduce-scatter's ``ALL_GATHER_RING``, all-reduce's ``ALL_REDUCE_RING``.
    Full fidelity runs TP collectives as rings whichever algorithm the closed form finds
    fastest."""
    return collective_named(kind).algorithms["ring"]


def _ring_traffic(cm: CostModel, c: Collectives, count: float) -> tuple[float, float, float]:
    """(bytes, ring steps, those across nodes) ``count`` of ``c``'s collectives have each TP
    member send, as its ring (``_ring``) describes one: ``sent(t)`` of its bytes in
    ``steps(t, nodes)``, ``inter_steps(t, nodes)`` of them across nodes."""
    ring, g = _ring(c.kind), cm.tp
    across = ring.inter_steps(g.size, g.nodes) if g.nodes > 1 else 0
    return (count * ring.sent(g.size) * c.nbytes, count * ring.steps(g.size, g.nodes),
            count * across)


def tensor_traffic(cm: CostModel) -> tuple[tuple[float, float, float], ...]:
    """What the layer's TP collectives have each ring member send, ((bytes, ring steps, those
    across nodes) forward, backward), for running them as flows (full fidelity), read from
    each one's ring
    (``_ring_traffic``): ``(t-1)/t X`` per all-gather or reduce-scatter and twice that per
    all-reduce, in ``t - 1`` or ``2(t - 1)`` steps — through its NVLink port in a node, or,
    for a group spanning nodes, split between NVLink and its NIC as NCCL's ring is
    (``Fabric.member_ring``)."""
    forward, backward = [0.0, 0, 0], [0.0, 0, 0]
    for c in tp_collectives(cm.s):
        for way, count in ((forward, c.forward), (backward, c.backward)):
            for i, part in enumerate(_ring_traffic(cm, c, count)):
                way[i] += part
    rerun = _rerun(cm)
    return tuple(forward), tuple(b + rerun * f for f, b in zip(forward, backward, strict=True))


def tensor_comm(cm: CostModel, gemms: tuple[float, float],
                split: bool = False) -> tuple[float, float]:
    """Exposed TP time, (forward, backward). Overlapped (``tp_overlaps``), each direction's
    collectives hide behind that direction's GEMMs, which lose ``comm_compute_slowdown`` of
    their speed meanwhile (``overlapped``); else behind Megatron-LM's default backward
    overlap, that of a split backward's input half with ``split``."""
    forward, backward = tensor_comm_total(cm)
    if tp_overlaps(cm):
        tail = pipelined_tail(cm)
        return (tail + overlapped(cm, forward - tail, gemms[0]),
                overlapped(cm, backward, gemms[1]))
    hidden, window = backward_overlap(cm, split)
    return forward, backward - hidden + overlapped(cm, hidden, window)


# Transformer Engine's userbuffers run the forward reduce-scatters after the row-parallel GEMMs
# (proj_fprop, fc2_fprop) by its "pipeline" method, the GEMM in 4 splits, each split's
# reduce-scatter beside the next split's GEMM (transformer_engine/pytorch/module/base.py,
# initialize_ub: get_default_config, "num_splits": tp_size if ring_exchange else 4). The
# all-gathers (ring_exchange) and the backward's (ring_exchange, bulk) hide whole.
TE_PIPELINE_SPLITS = 4


def pipelined_tail(cm: CostModel) -> float:
    """The forward TP time no GEMM can hide under ``tp_comm_overlap``: each forward
    reduce-scatter's last split, sent after the GEMM it follows has ended, while the residual
    add and norm after it wait for its result."""
    return sum(c.forward * _one(cm, c) for c in tp_collectives(cm.s)
               if c.kind == "reduce_scatter") / TE_PIPELINE_SPLITS


def pipelined_tail_traffic(cm: CostModel) -> tuple[float, float, float]:
    """(bytes, ring steps, those across nodes) that ``pipelined_tail`` sends through a
    member's port: a split of each forward reduce-scatter's ring traffic (``_ring_traffic``)."""
    tails = [_ring_traffic(cm, c, c.forward) for c in tp_collectives(cm.s)
             if c.kind == "reduce_scatter"]
    return tuple(sum(parts) / TE_PIPELINE_SPLITS for parts in zip(*tails, strict=True)) \
        if tails else (0.0, 0.0, 0.0)


def overlapped(cm: CostModel, comm: float, compute_time: float) -> float:
    """What a collective started with ``compute_time`` of compute adds to the critical path,
    the compute slowed meanwhile by the profile's ``comm_compute_slowdown``
    (``overlap.exposed_beside``)."""
    return exposed_beside(comm, compute_time, cm.profile.comm_compute_slowdown)


def context_comm(cm: CostModel, attention: tuple[float, float]) -> tuple[float, float]:
    """Exposed context-parallel time of one layer, (forward, backward), by ``cp_comm``; full
    recompute runs the forward's again in backward.

    - p2p, ring attention (Transformer Engine's ``AttnFuncWithCPAndKVP2P``): ``cp - 1`` steps
      each sending this rank's K/V block (``cp_kv_block_bytes``) to the next rank while the
      current block's attention runs; ``1/cp`` of the attention time hides each step.
      Backward sends K/V and their gradients (twice the bytes) behind the backward's attention.
    - allgather (``AttnFuncWithCPAndKVAllGather``, "KV all-gather between CP ranks is
      exposed"): forward all-gathers K and V, one collective each (``cp_gathered_kv_bytes``);
      backward gathers them again and reduce-scatters their gradients, again one each.
    - a2a (Ulysses): an all-to-all per tensor each way (``cp_a2a_bytes``: Q, K, V, output),
      exposed.
    - a2a+p2p (Megatron-Core's hierarchical CP): the all-to-alls among a node's CP ranks, then
      the ring across nodes over the heads they leave each rank, whose K/V blocks weigh what
      the plain ring's do (``context_levels``).
    """
    p = cm.s.parallel
    if p.cp == 1:
        return 0.0, 0.0
    if p.cp_comm == "allgather":  # K's collective and V's, of one size (MLA runs p2p only)
        half = cpm.cp_gathered_kv_bytes(cm.s) / 2
        forward = 2 * net.allgather_time(cm.cp, half)
        backward = forward + 2 * net.reduce_scatter_time(cm.cp, half)
    else:
        a2a_links, ring_links = _context_links(cm)
        a2a = (sum(net.alltoall_time(a2a_links, x) for x in cpm.cp_a2a_bytes(cm.s))
               if a2a_links else 0.0)
        forward, backward = (_ring_exposed(ring_links, cpm.cp_kv_block_bytes(cm.s), attention)
                             if ring_links else (0.0, 0.0))
        forward, backward = forward + a2a, backward + a2a
    return forward, backward + _rerun(cm) * forward


def _context_links(cm: CostModel) -> tuple[net.GroupLinks | None, net.GroupLinks | None]:
    """The links of the context-parallel all-to-alls' group and of the ring's, None for a
    level the exchange lacks (``context_levels``): the whole CP group under p2p or a2a, a
    node's CP ranks and their peers a node apart under a2a+p2p."""
    inner, ring = context_levels(cm.s)
    if cm.s.parallel.cp_comm == "a2a+p2p":
        stride = cm.placement.strides["cp"]
        a2a_links = net.group_links(cm.links_cluster, cm.profile, inner, stride)
        ring_links = net.group_links(cm.links_cluster, cm.profile, ring, stride * inner)
    else:
        a2a_links = ring_links = cm.cp
    return (a2a_links if inner > 1 else None), (ring_links if ring > 1 else None)


def _ring_exposed(links: net.GroupLinks, block: float, attention: tuple[float, float]
                  ) -> tuple[float, float]:
    """Ring attention over ``links.size`` ranks: ``size - 1`` steps each sending a K/V block
    while ``1/size`` of the attention runs; backward sends K/V and their gradients (twice the
    bytes) behind the backward's attention."""
    size = links.size
    send = net.p2p_time(links, block)
    return ((size - 1) * max(0.0, send - attention[0] / size),
            (size - 1) * max(0.0, 2 * send - attention[1] / size))


def context_traffic(cm: CostModel, attention: tuple[float, float]
                    ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """What ring attention sends to the next CP rank, for running it as one flow beside the
    attention it hides behind (full fidelity): ((bytes, steps, attention hiding it) forward,
    backward). As ``context_comm`` counts: ``cp - 1`` K/V blocks behind ``(cp-1)/cp`` of the
    attention forward, twice the bytes backward; a full recompute's re-run ring hides behind
    the same backward attention (which includes the re-run's). Nothing for the other
    exchanges (``allgather``, ``a2a``, ``a2a+p2p``): their collectives stay ``context_comm``'s
    closed forms in either fidelity."""
    p = cm.s.parallel
    if p.cp == 1 or p.cp_comm != "p2p":
        return (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)
    block, steps = cpm.cp_kv_block_bytes(cm.s), p.cp - 1
    forward = (steps * block, steps, steps / p.cp * attention[0])
    rounds = 2 + _rerun(cm)
    return forward, (rounds * steps * block, rounds * steps, steps / p.cp * attention[1])


def pipeline_gather_time(cm: CostModel) -> float:
    """The all-gather over the TP group that reassembles a scatter-gather pipeline message on
    arrival (``wl.pipeline_gather_bytes``); it runs before the chunk can start, so it adds to
    every message's time."""
    nbytes = wl.pipeline_gather_bytes(cm.s)
    return net.allgather_time(cm.tp, nbytes) if nbytes else 0.0
