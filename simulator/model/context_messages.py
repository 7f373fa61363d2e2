"""Context parallelism's messages: what one rank sends in each exchange a scenario's
``cp_comm`` names, per layer and micro-batch (``costs/layer_comm.context_comm`` times them,
``costs/traffic.cp_layer_bytes`` sums them, ``costs/memory`` holds the gathered K/V)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .workload import BYTES

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario


def cp_kv_block_bytes(s: Scenario) -> float:
    """One ring-attention step: K and V of this rank's ``b s/cp`` tokens (two of the ``2 cp``
    causal-balanced chunks), kv heads split by tp, in the training precision. Under MLA the
    ring passes the up-projected per-head keys (``d_qk``) and values (``d_v``), as Megatron-Core
    runs MLA under context parallelism."""
    m, p = s.model, s.parallel
    tokens = s.training.micro_batch * m.seq_len // p.cp
    width = (m.heads / p.tp * (m.qk_head_dim + m.value_head_dim) if m.mla
             else 2 * s.model.kv_width_per_rank(s.parallel.tp))
    return tokens * width * BYTES[s.training.precision]


def cp_gathered_kv_bytes(s: Scenario) -> float:
    """``cp_comm: allgather``: K and V of the whole sequence on one rank, the ``cp`` ranks'
    blocks (``cp_kv_block_bytes``) gathered (Transformer Engine's
    ``AttnFuncWithCPAndKVAllGather``, Llama 3 sec. 3.3.2)."""
    return s.parallel.cp * cp_kv_block_bytes(s)


def cp_a2a_bytes(s: Scenario) -> tuple[float, float, float, float]:
    """``cp_comm: a2a`` (Ulysses): what one rank puts into each all-to-all, one a tensor (Q, K,
    V of its ``b s/cp`` tokens, their attention output), as Transformer Engine's
    ``flash_attn_a2a_communicate`` and DeepSpeed's ``DistributedAttention`` post them; backward
    runs their transposes."""
    m, p = s.model, s.parallel
    tokens = s.training.micro_batch * m.seq_len // p.cp
    query, kv = m.query_width / p.tp, m.kv_width_per_rank(p.tp)
    act = BYTES[s.training.precision]
    return tokens * query * act, tokens * kv * act, tokens * kv * act, tokens * query * act
