"""The harness's context parallelism: each rank of a CP group holds a part of every sequence,
and attention reaches the rest by one of the exchanges the simulator prices (``cp_comm``).

- The sequence is cut in ``2 cp`` chunks and rank ``r`` keeps chunks ``r`` and ``2 cp - 1 - r``,
  so that every rank has as much causal attention to compute (Megatron-LM's
  ``get_batch_on_this_cp_rank``).
- ``p2p``: ring attention as Transformer Engine runs it (``AttnFuncWithCPAndKVP2P``,
  transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): ``cp - 1``
  steps, each passing the K/V block on to the next rank while the one in hand is attended to;
  blocks merge by their log-sum-exp. Of a block from an earlier rank only its first chunk is
  seen, by all of this rank's queries; of one from a later rank, both chunks, by the second
  half of the queries: half a block's work each time, as TE does it. Backward runs the ring
  the other way, each step's one message carrying a K/V block on with the gradient of the one
  before: ``cp - 1`` of each, as TE sends them.
- ``allgather``: K and V of the whole sequence gathered, each query chunk attending to the keys
  before it (``AttnFuncWithCPAndKVAllGather``); backward gathers them again and
  reduce-scatters their gradients.
- ``a2a`` (Ulysses, DeepSpeed's ``DistributedAttention``): an all-to-all a tensor (Q, K, V)
  trades the sequence split for a split of the heads, the whole sequence is attended to, and
  one more trades the output back.

Blocks run PyTorch's fused CPU attention kernel with its log-sum-exp (the kernel the
single-process model runs), so no rank keeps the scores. The hierarchical ``a2a+p2p`` is not
built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

from .shrink import CP_COMMS
from .tensor_parallel import reduce_scatter

_block_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_block_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in its CP group (size 1: the whole sequence here) and the exchange."""

    group: dist.ProcessGroup | None = None
    size: int = 1
    rank: int = 0
    comm: str = "p2p"
    ranks: tuple[int, ...] = (0,)  # the group's global ranks, for point-to-point sends


def local_positions(seq_len: int, cp: ContextParallel) -> torch.Tensor:
    """The positions this rank keeps: chunks ``rank`` and ``2 cp - 1 - rank`` of ``2 cp``."""
    if cp.size == 1:
        return torch.arange(seq_len)
    c = seq_len // (2 * cp.size)
    first, second = cp.rank, 2 * cp.size - 1 - cp.rank
    return torch.cat([torch.arange(first * c, (first + 1) * c),
                      torch.arange(second * c, (second + 1) * c)])


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cp: ContextParallel) -> torch.Tensor:
    """Causal attention of this rank's queries ``(b, heads, 2c, d)`` over the whole sequence;
    K/V may have fewer heads (GQA)."""
    if cp.comm == "p2p":
        return _RingAttention.apply(q, k, v, cp)
    if cp.comm == "allgather":
        return _GatheredAttention.apply(q, k, v, cp)
    if cp.comm == "a2a":
        return _ulysses(q, k, v, cp)
    raise ValueError(f"cp_comm {cp.comm!r}: the harness runs {', '.join(CP_COMMS)}")


# --- blocks of attention and their merge -------------------------------------------------------

def _widen(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V repeated to the queries' heads (the CPU kernel takes one head count)."""
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _narrow(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of widened K or V summed back onto its own heads."""
    b, h, s, d = grad.shape
    return grad if h == kv_heads else grad.view(b, kv_heads, h // kv_heads, s, d).sum(2)


def _attend(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp per query row) of one block."""
    return _block_forward(q, _widen(k, q.shape[1]), _widen(v, q.shape[1]), 0.0, causal)


def _merge(out, lse, rows: slice, block_out, block_lse) -> None:
    """Fold one block's softmax into the running one over ``rows``, in place."""
    new = torch.logaddexp(lse[:, :, rows], block_lse)
    out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - new).unsqueeze(-1)
                       + block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse[:, :, rows] = new


def _attend_backward(grad, q, k, v, out, lse, causal: bool):
    """(dq, dk, dv) of one block, from the merged output and log-sum-exp of its rows."""
    dq, dk, dv = _block_backward(grad.contiguous(), q, _widen(k, q.shape[1]),
                                 _widen(v, q.shape[1]), out.contiguous(), lse.contiguous(),
                                 0.0, causal)
    return dq, _narrow(dk, k.shape[1]), _narrow(dv, k.shape[1])


# --- p2p: ring attention --------------------------------------------------------------------

def _ring_blocks(source: int, cp: ContextParallel, c: int):
    """(query rows, key rows, causal) of the K/V block of CP rank ``source``: this rank's own
    causally; an earlier rank's first chunk by every query; a later rank's whole block by the
    second half of the queries."""
    if source == cp.rank:
        return slice(None), slice(None), True
    if source < cp.rank:
        return slice(None), slice(0, c), False
    return slice(c, 2 * c), slice(None), False


def _exchange(cp: ContextParallel, send: torch.Tensor, recv: torch.Tensor, tag: int,
              shift: int) -> list:
    """Send to the rank ``shift`` ahead in the ring, receive from the one as far behind
    (asynchronous)."""
    ahead, behind = cp.ranks[(cp.rank + shift) % cp.size], cp.ranks[(cp.rank - shift) % cp.size]
    return [dist.isend(send, dst=ahead, tag=tag), dist.irecv(recv, src=behind, tag=tag)]


def _wait(works: list) -> None:
    for work in works:
        work.wait()


class _RingAttention(torch.autograd.Function):
    """Forward: at step ``i`` this rank holds rank ``r - i``'s K/V and passes it on to
    ``r + 1``. Backward runs the ring the other way from the block the forward ended with
    (``r + 1``'s): at step ``i`` it holds rank ``r + i + 1``'s K/V, and one message a step
    carries that block on with the gradient of the previous one, summed over the ranks it
    came by, so that after ``cp`` steps every rank holds its own K/V's whole gradient."""

    @staticmethod
    def forward(ctx, q, k, v, cp: ContextParallel):
        c = q.shape[2] // 2
        kv, out, lse = torch.stack([k, v]).contiguous(), None, None
        for step in range(cp.size):
            works, incoming = [], None
            if step < cp.size - 1:  # the next block travels while this one is attended to
                incoming = torch.empty_like(kv)
                works = _exchange(cp, kv, incoming, tag=step, shift=1)
            rows, keys, causal = _ring_blocks((cp.rank - step) % cp.size, cp, c)
            block_out, block_lse = _attend(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys],
                                           causal)
            if step == 0:
                out, lse = block_out.clone(), block_lse.clone()
            else:
                _merge(out, lse, rows, block_out, block_lse)
            _wait(works)
            kv = incoming if incoming is not None else kv
        ctx.cp = cp
        ctx.save_for_backward(q, kv, out, lse)  # kv: the last block in hand
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kv, out, lse = ctx.saved_tensors
        cp, c = ctx.cp, q.shape[2] // 2
        dq, carried = torch.zeros_like(q), None
        for step in range(cp.size):
            first, last = step == 0, step == cp.size - 1
            message = kv if first else carried if last else torch.cat([kv, carried])
            incoming = torch.empty_like(kv if first or last else torch.cat([kv, kv]))
            works = _exchange(cp, message, incoming, tag=step, shift=-1)
            rows, keys, causal = _ring_blocks((cp.rank + step + 1) % cp.size, cp, c)
            dq_, dk_, dv_ = _attend_backward(grad[:, :, rows], q[:, :, rows], kv[0][:, :, keys],
                                             kv[1][:, :, keys], out[:, :, rows],
                                             lse[:, :, rows], causal)
            dq[:, :, rows] += dq_
            part = torch.zeros_like(kv)
            part[0][:, :, keys], part[1][:, :, keys] = dk_, dv_
            _wait(works)
            carried = part if first else part + (incoming if last else incoming[2:])
            kv = incoming if first else incoming[:2]
        return dq, carried[0], carried[1], None


# --- allgather --------------------------------------------------------------------------------

def _gather_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """All ranks' ``(b, h, 2c, d)`` parts, as the whole sequence in order."""
    parts = [torch.empty_like(x) for _ in range(cp.size)]
    dist.all_gather(parts, x.contiguous(), group=cp.group)
    halves = [p.chunk(2, dim=2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=2)


def _scatter_sequence_sum(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """The inverse of ``_gather_sequence`` for gradients: each rank's chunks, summed over the
    group (a reduce-scatter)."""
    chunks = x.chunk(2 * cp.size, dim=2)
    parts = [torch.cat([chunks[r], chunks[2 * cp.size - 1 - r]], dim=2) for r in range(cp.size)]
    return reduce_scatter(parts, cp.group)


def _gathered_blocks(cp: ContextParallel, c: int):
    """For each of this rank's query chunks: (query rows, its chunk index); it attends to the
    gathered keys before its chunk in full and to its own chunk causally."""
    return [(slice(0, c), cp.rank), (slice(c, 2 * c), 2 * cp.size - 1 - cp.rank)]


class _GatheredAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cp: ContextParallel):
        c = q.shape[2] // 2
        k_all, v_all = _gather_sequence(k, cp), _gather_sequence(v, cp)
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:3])
        for rows, chunk in _gathered_blocks(cp, c):
            own = slice(chunk * c, (chunk + 1) * c)
            o, lse_ = _attend(q[:, :, rows], k_all[:, :, own], v_all[:, :, own], causal=True)
            out[:, :, rows], lse[:, :, rows] = o, lse_
            if chunk:
                earlier = slice(0, chunk * c)
                _merge(out, lse, rows, *_attend(q[:, :, rows], k_all[:, :, earlier],
                                                v_all[:, :, earlier], causal=False))
        ctx.cp = cp
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        cp, c = ctx.cp, q.shape[2] // 2
        k_all, v_all = _gather_sequence(k, cp), _gather_sequence(v, cp)
        dq, dk_all, dv_all = torch.zeros_like(q), torch.zeros_like(k_all), torch.zeros_like(v_all)
        for rows, chunk in _gathered_blocks(cp, c):
            blocks = [(slice(chunk * c, (chunk + 1) * c), True)]
            blocks += [(slice(0, chunk * c), False)] if chunk else []
            for keys, causal in blocks:
                dq_, dk_, dv_ = _attend_backward(grad[:, :, rows], q[:, :, rows],
                                                 k_all[:, :, keys], v_all[:, :, keys],
                                                 out[:, :, rows], lse[:, :, rows], causal)
                dq[:, :, rows] += dq_
                dk_all[:, :, keys] += dk_
                dv_all[:, :, keys] += dv_
        return dq, _scatter_sequence_sum(dk_all, cp), _scatter_sequence_sum(dv_all, cp), None


# --- a2a: Ulysses -----------------------------------------------------------------------------

def _natural_order(cp: ContextParallel, c: int) -> torch.Tensor:
    """Where each position sits in the ranks' parts laid end to end."""
    layout = torch.cat([local_positions(2 * cp.size * c, ContextParallel(size=cp.size, rank=r))
                        for r in range(cp.size)])
    return torch.argsort(layout)


def _heads_for_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """``(b, h, 2c, d)`` of this rank's tokens -> ``(b, h/cp, s, d)`` of every token, in order."""
    b, h, n, d = x.shape
    send = x.view(b, cp.size, h // cp.size, n, d).transpose(0, 1).contiguous()
    got = wait_tensor(all_to_all_single_autograd(send.view(-1), None, None, cp.group))
    whole = got.view(cp.size, b, h // cp.size, n, d).permute(1, 2, 0, 3, 4)
    whole = whole.reshape(b, h // cp.size, cp.size * n, d)
    return whole[:, :, _natural_order(cp, n // 2).to(x.device)]


def _sequence_for_heads(y: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """The inverse: ``(b, h/cp, s, d)`` in order -> ``(b, h, 2c, d)`` of this rank's tokens."""
    b, hs, s, d = y.shape
    n = s // cp.size
    layout = torch.argsort(_natural_order(cp, n // 2)).to(y.device)
    parts = y[:, :, layout].view(b, hs, cp.size, n, d).permute(2, 0, 1, 3, 4).contiguous()
    got = wait_tensor(all_to_all_single_autograd(parts.view(-1), None, None, cp.group))
    return got.view(cp.size, b, hs, n, d).transpose(0, 1).reshape(b, hs * cp.size, n, d)


def _ulysses(q, k, v, cp: ContextParallel) -> torch.Tensor:
    q, k, v = (_heads_for_sequence(x, cp) for x in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                       enable_gqa=k.shape[1] != q.shape[1])
    return _sequence_for_heads(y, cp)
