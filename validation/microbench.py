"""Microbenchmarks that calibration fits the cost model to, run on every rank at once.

All ranks measure together, as they train together: on a CPU they share caches and memory
bandwidth, so a core measured alone would look faster than it is in a real run. Each item is
timed after a barrier, repeated, in several rounds over the whole list, and the median round
kept; rank 0's rows are the result. What is
measured mirrors what the simulator costs:

- **GEMMs** of a transformer's linear layers (QKV, attention output, MLP up and down, output
  layer) over token counts and widths, forward and both backward products together, since
  the simulator prices a layer's backward at twice its forward;
- **element-wise work** of one layer (two norms, two residual adds, the activation) and of the
  loss (softmax cross-entropy over the vocabulary), forward and backward;
- the **optimizer step** (AdamW) over a few parameter counts, in layer-shaped tensors;
- **collectives** over message sizes, each issued right after a GEMM as training issues it
  and timed alone: all-reduce, all-gather, send/recv (ping-pong: the row is the round trip),
  and reduce-scatter only where it is real (NCCL: gloo emulates it with an all-reduce,
  NOTES.md C1).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

MIN_REPEAT_S = 0.05  # repeat a timing for about this long (3 to 50 times) in each round


@dataclass(frozen=True)
class BenchPlan:
    """What to measure; ``quick`` keeps only the small end (for tests)."""

    backend: str = "gloo"
    tokens: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    hiddens: tuple[int, ...] = (256, 512, 1024, 2048)
    vocabs: tuple[int, ...] = (8192, 32768)
    max_gemm_flops: float = 1.5e10  # one measurement's forward + backward FLOPs
    optimizer_params: tuple[int, ...] = (2_000_000, 8_000_000, 32_000_000)
    message_bytes: tuple[int, ...] = tuple(4 ** k for k in range(6, 14))  # 4 KiB .. 64 MiB
    rounds: int = 3

    @classmethod
    def gpu(cls) -> BenchPlan:
        """Shapes for a GPU: it runs the CPU plan's largest GEMM (1.5e10 FLOPs) in about 20 us,
        bound by launch and synchronisation, which is what the first H100 calibration measured
        (0.0004-0.10 of peak, topologies/measurements/own/). Here the largest GEMMs take
        milliseconds, as a training step's do."""
        return cls("nccl", tokens=(2048, 4096, 8192, 16384), hiddens=(2048, 4096, 8192),
                   vocabs=(32768, 131072), max_gemm_flops=6e13,
                   optimizer_params=(100_000_000, 400_000_000, 1_600_000_000),
                   message_bytes=tuple(4 ** k for k in range(6, 16)))  # 4 KiB .. 1 GiB

    @classmethod
    def quick(cls, backend: str = "gloo") -> BenchPlan:
        """The small end, still in three rounds: with one, a slow spell on a shared machine
        decided a smoke test (a stalled 4 KiB all-reduce whose mean outlasted the 8 MiB one,
        so the fit found no bandwidth, 2026-11-29)."""
        return cls(backend, tokens=(64, 128), hiddens=(64, 128), vocabs=(512,),
                   optimizer_params=(100_000,), message_bytes=(4096, 1 << 20, 1 << 23))


def measure(rank: int, world: int, plan: BenchPlan) -> list[dict]:
    """Every microbenchmark of ``plan``, on this rank (rank 0's rows are kept)."""
    device = torch.device(f"cuda:{rank}") if plan.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = [*_gemms(plan, device, dtype), *_elementwise(plan, device, dtype),
             *_optimizer(plan, device)]
    if world > 1:
        cases += _collectives(plan, device, world)
    return _in_rounds(cases, device, plan.rounds)


Case = tuple[dict, Callable[[], object]]  # a raw row (without its time) and what to time


def _in_rounds(cases: list[Case], device: torch.device, rounds: int) -> list[dict]:
    """Time every case once per round, the rounds one after the other over the whole list: on
    a shared machine a slow spell then spoils one round of a few cases, not every timing of
    one case."""
    timings: list[list[float]] = [[] for _ in cases]
    for r in range(rounds):
        if dist.get_rank() == 0:
            print(f"calibrate: round {r + 1} of {rounds} ({len(cases)} timings)",
                  file=sys.stderr, flush=True)
        for times, (row, fn) in zip(timings, cases, strict=True):
            # gloo's collectives have a heavy tail (median 0.7 ms, mean 2 ms for 256 KiB
            # here): a step pays their sum, so they keep the mean; kernels the median
            stat = statistics.mean if row["kind"] == "collective" else statistics.median
            times.append(stat(_timed(fn, device)))
    return [{**row, "seconds": _across_rounds(row, times),
             "round_spread": max(times) - min(times)}
            for (row, _), times in zip(cases, timings, strict=True)]


def _across_rounds(row: dict, times: list[float]) -> float:
    """The median round. (The fastest round would dodge other tenants' bursts, but a real run
    meets them too: on this project's VM it read 5-18% fast against the runs it predicts.)"""
    return statistics.median(times)


def _timed(fn: Callable[[], object], device: torch.device) -> list[float]:
    """Seconds of each call of ``fn`` after one warm-up call, all ranks starting together and
    repeating it equally often (a collective must be called the same number of times)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t = time.perf_counter()
    fn()
    sync()
    wanted = min(50, max(3, math.ceil(MIN_REPEAT_S / (time.perf_counter() - t))))
    reps = torch.tensor([wanted], device=device)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    dist.barrier()
    times: list[float] = []
    for _ in range(int(reps.item())):
        t = time.perf_counter()
        own = fn()  # a case that times itself returns its seconds
        sync()
        times.append(own if isinstance(own, float) else time.perf_counter() - t)
    return times


def gemm_shapes(plan: BenchPlan) -> list[tuple[int, int, int]]:
    """(tokens, in, out) of the linear layers a transformer of each width runs."""
    shapes = []
    for tokens in plan.tokens:
        for h in plan.hiddens:
            for k, n in ((h, h), (h, 3 * h), (h, 4 * h), (4 * h, h)):
                if 6 * tokens * k * n <= plan.max_gemm_flops:
                    shapes.append((tokens, k, n))
        for vocab in plan.vocabs:
            h = plan.hiddens[len(plan.hiddens) // 2]
            if 6 * tokens * h * vocab <= plan.max_gemm_flops:
                shapes.append((tokens, h, vocab))
    return shapes


def _gemms(plan: BenchPlan, device: torch.device, dtype: torch.dtype) -> list[Case]:
    cases = []
    for tokens, k, n in gemm_shapes(plan):
        x = torch.randn(tokens, k, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(n, k, device=device, dtype=dtype, requires_grad=True)
        grad = torch.ones(tokens, n, device=device, dtype=dtype)
        # autograd.grad, not backward(): adding into .grad on every call costs small shapes
        # up to a third more here, far more than the model's gradient accumulation does
        cases.append(({"kind": "gemm", "op": "linear_fwd_bwd", "tokens": tokens, "k": k,
                       "n": n, "flops": 6.0 * tokens * k * n},
                      lambda x=x, w=w, grad=grad: torch.autograd.grad(F.linear(x, w), (x, w),
                                                                      grad)))
    return cases


def _elementwise(plan: BenchPlan, device: torch.device, dtype: torch.dtype) -> list[Case]:
    """One layer's norms, residual adds and GELU, and the loss, forward and backward."""
    rows = []
    for tokens in plan.tokens[:3]:
        for h in plan.hiddens[:3]:
            x = torch.randn(tokens, h, device=device, dtype=dtype, requires_grad=True)
            u = torch.randn(tokens, 4 * h, device=device, dtype=dtype, requires_grad=True)
            norm = torch.nn.LayerNorm(h, device=device, dtype=dtype)

            def layer(x=x, u=u, norm=norm):
                y = norm(x) + x
                y = norm(y) + y
                (y.sum() + F.gelu(u).sum()).backward()
            rows.append(({"kind": "elementwise", "op": "layer_norms_adds_gelu",
                          "tokens": tokens, "k": h, "n": 4 * h}, layer))
        for vocab in plan.vocabs:
            logits = torch.randn(tokens, vocab, device=device, dtype=torch.float32,
                                 requires_grad=True)
            target = torch.randint(0, vocab, (tokens,), device=device)
            rows.append(({"kind": "elementwise", "op": "cross_entropy", "tokens": tokens,
                          "k": 0, "n": vocab},
                         lambda lg=logits, tg=target: F.cross_entropy(lg, tg).backward()))
    return rows


def _optimizer(plan: BenchPlan, device: torch.device) -> list[Case]:
    """AdamW over layer-shaped tensors (4 h x h and 2 4h x h per layer): how a model's
    parameters come, which matters on a CPU, where each tensor's passes stay in cache."""
    rows = []
    h = plan.hiddens[min(1, len(plan.hiddens) - 1)]
    for params in plan.optimizer_params:
        layers = max(1, round(params / (12 * h * h)))
        shapes = [(h, h)] * 4 + [(4 * h, h)] * 2
        tensors = [torch.nn.Parameter(torch.randn(shape, device=device))
                   for _ in range(layers) for shape in shapes]
        for t in tensors:
            t.grad = torch.randn_like(t)
        opt = torch.optim.AdamW(tensors, lr=1e-3)
        rows.append(({"kind": "optimizer", "op": "adamw_step", "k": h, "tensors": len(tensors),
                      "params": sum(t.numel() for t in tensors)}, opt.step))
    return rows


def _collectives(plan: BenchPlan, device: torch.device, world: int) -> list[Case]:
    rows = []
    ops = {"all_reduce": _all_reduce, "all_gather": _all_gather, "ping_pong": _ping_pong}
    if plan.backend == "nccl":  # gloo's reduce-scatter is an all-reduce in disguise
        ops["reduce_scatter"] = _reduce_scatter
    for op, make in ops.items():
        for nbytes in plan.message_bytes:
            rows.append(({"kind": "collective", "op": op, "bytes": nbytes, "world": world},
                         _after_compute(make(nbytes // 4 // world * world, device, world),
                                        device)))
    return rows


LAYER_GEMMS = 4  # products run before each timed collective (``_after_compute``)


def _after_compute(collective: Callable[[], object], device: torch.device):
    """Issue the collective right after a layer's worth of GEMMs, as training issues it, and
    time only the collective: it then pays what it pays in a layer — ranks arriving apart and
    a transport that was idle. On gloo that cost grows with the compute before it: a 256 KiB
    all-reduce between two ranks took 1.5 ms back to back, 0.8-1.9 ms after one 128x512x768
    product, 2.0 ms after ~3 ms of them and 3.0-3.3 ms after ~6 ms (2026-11-28, this project's
    2-core VM), and the harness's tensor-parallel all-reduces, which follow 1-3 ms of a layer's
    compute, took 2.0 ms on average. After the single small GEMM this used to run first, the
    calibration read their alpha at 0.43 ms and TP 2 validated 27-30% fast; after four at
    0.97 ms, and TP 2 read -4% to +10% (docs/validation.md)."""
    x = torch.randn(128, 512, device=device)
    w = torch.randn(1024, 512, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed() -> float:
        for _ in range(LAYER_GEMMS):
            F.linear(x, w)
        sync()
        start = time.perf_counter()
        collective()
        sync()
        return time.perf_counter() - start
    return timed


def _all_reduce(n: int, device: torch.device, world: int):
    buf = torch.ones(n, device=device)
    return lambda: dist.all_reduce(buf)


def _all_gather(n: int, device: torch.device, world: int):
    """Gathers ``n`` elements in all (the all-gather's output per rank)."""
    part = torch.ones(n // world, device=device)
    parts = [torch.empty_like(part) for _ in range(world)]
    return lambda: dist.all_gather(parts, part)


def _reduce_scatter(n: int, device: torch.device, world: int):
    parts = [torch.ones(n // world, device=device) for _ in range(world)]
    out = torch.empty(n // world, device=device)
    return lambda: dist.reduce_scatter(out, parts)


def _ping_pong(n: int, device: torch.device, world: int):
    """Rank 0 sends one message to rank 1 and gets it back: the row is the round trip."""
    buf = torch.ones(n, device=device)
    rank = dist.get_rank()

    def ping_pong():
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return ping_pong
