"""How an MoE layer's tokens are routed: the busiest expert-parallel rank's share of them and
the HBM traffic of permuting them to the experts and back (Megatron-Core's alltoall dispatcher,
megatron/core/transformer/moe/token_dispatcher.py and moe_utils.py)."""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario
    from ..inputs.specs import ModelSpec


def routing_load(m: ModelSpec, ep: int) -> float:
    """``expert_load`` of model ``m`` over ``ep`` expert-parallel ranks."""
    if m.capacity_factor is not None:
        return m.capacity_factor
    return min(m.expert_imbalance, ep)


def remote_nodes_per_token(m: ModelSpec, local: int, ep: int) -> float:
    """Expected number of other nodes a token's ``top_k`` experts sit on, the experts spread
    evenly over the ``ep`` ranks, ``local`` of them a node, and routed uniformly (balanced):
    each other node holds none of them with probability ``C(E' - E_n, k) / C(E', k)``
    (``E_n = E local/ep`` experts a node). Without groups ``E' = E``; under group-limited
    routing (``expert_groups`` G, ``expert_groups_per_token`` P), where each group fills whole
    nodes, a node is a candidate only when its group is among the token's P (``P/G`` of them)
    and the experts are drawn from those groups' ``E' = P E/G``; groups smaller than a node
    are counted as no limit, which errs toward more traffic. What DeepEP sends across nodes,
    one copy a node (``parallel.moe_dispatcher: deepep``; DeepSeek-V3 report arXiv 2412.19437
    sec. 3.2.2)."""
    nodes = -(-ep // local)
    if nodes == 1:
        return 0.0
    per_node, candidates, chosen = m.experts * local / ep, m.experts, 1.0
    groups, per_token = m.expert_groups, m.expert_groups_per_token
    if groups and nodes % groups == 0:  # each group fills nodes // groups whole nodes
        candidates, chosen = m.experts * per_token / groups, per_token / groups
    none = prod((candidates - per_node - i) / (candidates - i) for i in range(m.top_k))
    return (nodes - 1) * chosen * (1 - none)


def forwarded_bytes(m: ModelSpec, nbytes: float, local: int, ep: int) -> tuple[float, float]:
    """(across nodes, over NVLink) bytes one rank sends in a forwarded dispatch (or combine)
    of its ``nbytes`` of routed copies: one copy of its tokens to each other node reached
    (``remote_nodes_per_token``), and the ``(local - 1)/local`` of the copies that fan out from
    the GPU they reached to another of its node."""
    return (nbytes / m.top_k * remote_nodes_per_token(m, local, ep),
            nbytes * (local - 1) / local)


def routed_rows(s: Scenario, tokens: float) -> float:
    """Rows the busiest rank's local experts run on together, of a micro-batch's ``tokens``
    (``b s/cp``; a dense MLP's ``tokens``): their ``top_k`` copies times ``routing_load``, of
    the ``etp/tp`` share of the tokens its expert-TP group gathers: all of them where experts
    split like the dense MLP (``etp = tp``), its own sequence shard where they are whole
    (``expert_tp`` 1, parallel folding)."""
    m, p = s.model, s.parallel
    if m.experts == 1:
        return tokens
    return tokens * p.etp / p.tp * m.top_k * routing_load(m, p.ep)


def permutation_bytes(s: Scenario, act: int) -> float:
    """HBM bytes of an MoE layer's token permutations per micro-batch forward (backward runs
    them transposed: the same bytes), Megatron-Core's alltoall dispatcher
    (megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py): permutation 1 reads the
    rank's ``T/o`` tokens and writes their ``top_k`` copies, and the combine's unpermutation
    reads the copies back and writes the sums; with several local experts, permutation 2
    (``sort_chunks_by_idxs``) reads and writes the ``routed_rows`` received (after the expert-TP
    all-gather) and the combine sorts them back."""
    m, p = s.model, s.parallel
    if m.experts == 1:
        return 0.0
    local = s.training.micro_batch * m.seq_len / (p.cp * (p.tp if p.sequence_parallel else 1))
    total = 2 * (local + local * m.top_k) * m.hidden * act
    if m.experts // p.ep > 1:
        received = routed_rows(s, s.training.micro_batch * m.seq_len / p.cp)
        total += 2 * 2 * received * m.hidden * act
    return total
