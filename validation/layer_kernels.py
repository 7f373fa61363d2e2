"""Layer-level measurements on one GPU: what a split backward and a collective beside a GEMM
cost (issue 23 items 2 and 6; docs/profiles.md, "Measured on our own GPUs").

    python -m clustersim.validation.layer_kernels --out DIR [--quick]
    python3 validation/layer_kernels.py --out DIR     # on a GPU machine without clustersim

Writes ``DIR/layers.csv``. Two sweeps, each timed with CUDA events (median and 10th / 90th
percentile of repeated samples after a warm-up):

- **split backward**: one transformer layer as one tensor-parallel rank computes it (the
  shard of a Megatron layer: QKV, causal attention, projection, MLP, each ``1/tp`` wide, the
  collectives left out), bf16, forward then backward four ways: ``whole`` (one backward),
  ``immediate`` (the same through the deferrable linear layer), ``deferred`` (the zero-bubble
  fork's and Transformer Engine's split: the input half stores each linear layer's
  ``(X, dY)`` and the weight half runs the same weight-gradient GEMMs later), and
  ``pytorch`` (``torch.distributed.pipelining``'s ``stage_backward_input`` /
  ``stage_backward_weight``, as the gloo harness runs zero-bubble). ``host_s`` is the host's
  time to issue a pass: where it nears the GPU's, the layer is launch-bound; ``kernels`` is
  the PyTorch profiler's count of the GPU operations a whole pass launches.
- **overlap**: large bf16 GEMMs alone and beside a copy kernel that holds ``sms``
  multiprocessors for its whole run (a stand-in for NCCL's channels, one thread block each),
  on a second stream; ``slowdown`` is the GEMM's time beside it over its time alone, minus
  one, and ``gbps`` what the copy moved meanwhile (read plus written).

``--quick`` runs a tiny layer on whatever device there is (the CPU in tests) and skips the
overlap sweep where there is no CUDA: a check of the script, not a measurement.
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

try:
    from .kernels import (
        clock,
        device_info,
        elapsed,
        row,
        start_sweep,
        sweep_parser,
        sync,
        write_csv,
    )
except ImportError:  # run as a file on a machine where clustersim is not installed
    from kernels import (  # type: ignore[no-redef]
        clock,
        device_info,
        elapsed,
        row,
        start_sweep,
        sweep_parser,
        sync,
        write_csv,
    )

# (name, hidden, ffn_hidden, heads, tp, sequence, micro-batch): one rank's share of a layer.
LAYERS = (("gpt-1.3b tp1", 2048, 8192, 16, 1, 2048, 4),
          ("gpt-6.7b tp1", 4096, 16384, 32, 1, 2048, 2),
          ("gpt-3.6b tp8", 3072, 12288, 32, 8, 2048, 1),
          ("gpt-3.6b tp8 mbs4", 3072, 12288, 32, 8, 2048, 4),
          ("gpt-3.6b tp4", 3072, 12288, 32, 4, 2048, 1),
          ("gpt3-175b tp8", 12288, 49152, 96, 8, 2048, 1),
          ("gpt3-175b tp8 mbs2", 12288, 49152, 96, 8, 2048, 2),
          ("llama-70b-mha tp8", 8192, 28672, 64, 8, 4096, 1))
QUICK_LAYERS = (("quick", 64, 256, 4, 2, 32, 2),)
OVERLAP_GEMMS = ((8192, 8192, 8192), (4096, 6144, 12288), (4096, 12288, 6144), (8192, 3584, 8192))
OVERLAP_SMS = (8, 16, 24, 32)
# whole: nn.Linear's backward; immediate: the deferrable layer computing its weight gradient
# in place (deferred's baseline: the same kernels in the same order but for the wait)
VARIANTS = ("whole", "immediate", "deferred", "pytorch")
FIELDS = ("round", "sweep", "name", "variant", "pass", "hidden", "ffn", "heads", "tp", "seq",
          "batch", "m", "n", "k", "sms", "seconds", "p10_s", "p90_s", "host_s", "kernels",
          "tflops", "gbps", "slowdown", "note")


class Deferral:
    """Where deferred linear layers leave their weight-gradient work: ``defer`` on, each
    backward stores ``(weight, X, dY)``; ``flush`` runs the stored GEMMs."""

    def __init__(self) -> None:
        self.defer = False
        self.items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def flush(self) -> None:
        for weight, x, dy in self.items:
            _accumulate(weight, x, dy)
        self.items.clear()


def _accumulate(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> None:
    wgrad = dy.t() @ x
    if weight.grad is None:
        weight.grad = wgrad
    else:
        weight.grad.add_(wgrad)


class _DeferredMatmul(torch.autograd.Function):
    """``x W^T`` whose weight gradient is computed in its backward or stored for later."""

    @staticmethod
    def forward(ctx, x, weight, deferral):
        ctx.save_for_backward(x, weight)
        ctx.deferral = deferral
        return x @ weight.t()

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        if ctx.deferral.defer:
            ctx.deferral.items.append((weight, x2, dy2))
        else:
            _accumulate(weight, x2, dy2)
        return dy @ weight, None, None


class Linear(nn.Module):
    """A bias-free linear layer; with a ``Deferral`` its weight gradient can wait."""

    def __init__(self, into: int, out: int, deferral: Deferral | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, into) * into ** -0.5)
        self.deferral = deferral

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deferral is None:
            return F.linear(x, self.weight)
        return _DeferredMatmul.apply(x, self.weight, self.deferral)


class LayerShard(nn.Module):
    """One tensor-parallel rank's share of a GPT layer (pre-norm, GELU MLP, causal attention),
    without the collectives: what that rank computes."""

    def __init__(self, hidden: int, ffn: int, heads: int, tp: int,
                 deferral: Deferral | None) -> None:
        super().__init__()
        self.heads, width = heads // tp, hidden // tp
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = Linear(hidden, 3 * width, deferral)
        self.proj = Linear(width, hidden, deferral)
        self.fc1 = Linear(hidden, ffn // tp, deferral)
        self.fc2 = Linear(ffn // tp, hidden, deferral)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


def layer_rows(device: torch.device, quick: bool, repeats: int) -> list[dict]:
    rows = []
    for name, hidden, ffn, heads, tp, seq, batch in (QUICK_LAYERS if quick else LAYERS):
        shape = dict(sweep="split", name=name, hidden=hidden, ffn=ffn, heads=heads, tp=tp,
                     seq=seq, batch=batch)
        # forward and backward GEMM FLOPs of the shard: 2 * tokens * weights, times 3
        weights = (4 * hidden * hidden + 2 * hidden * ffn) / tp
        flops = 6.0 * batch * seq * weights
        for variant in VARIANTS:
            samples = time_passes(variant, hidden, ffn, heads, tp, seq, batch, device, repeats)
            counts = kernel_counts(hidden, ffn, heads, tp, seq, batch, device) \
                if variant == "whole" else {}
            for pass_, (gpu, host) in samples.items():
                r = row("layer", gpu, flops if pass_ == "step" else 0.0, **shape,
                        variant=variant, **{"pass": pass_})
                r["host_s"] = sorted(host)[len(host) // 2]
                r["kernels"] = counts.get(pass_, "")
                rows.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def kernel_counts(hidden, ffn, heads, tp, seq, batch, device) -> dict[str, int]:
    """GPU operations (kernels, copies, fills) a whole forward and backward launch, counted by
    the PyTorch profiler: the host's work per pass is about this many launches."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile
    layer = LayerShard(hidden, ffn, heads, tp, None).to(device, torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    layer(x).backward(torch.randn_like(x))  # warm: the first pass allocates and picks kernels
    sync(device)
    counts = {}
    for pass_ in ("forward", "backward"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            if pass_ == "forward":
                y = layer(x)
            else:
                y.backward(torch.randn_like(x))
            sync(device)
        counts[pass_] = sum(1 for e in prof.events()
                            if e.device_type == torch.autograd.DeviceType.CUDA)
    counts["step"] = counts["forward"] + counts["backward"]
    return counts


def time_passes(variant, hidden, ffn, heads, tp, seq, batch, device, repeats):
    """GPU and host seconds of each pass of ``repeats`` forward-backward iterations."""
    deferral = Deferral() if variant in ("immediate", "deferred") else None
    layer = LayerShard(hidden, ffn, heads, tp, deferral).to(device, torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    split = variant in ("deferred", "pytorch")
    passes = ("forward", "input", "weight") if split else ("forward", "backward")
    out = {p: ([], []) for p in (*passes, "step")}
    for i in range(repeats + 3):  # three warm-ups
        marks, state = [], None
        for p in passes:
            start, host = clock(device), time.perf_counter()
            state = _run_pass(variant, p, layer, x, dy, state, deferral)
            marks.append((p, start, time.perf_counter() - host))
        sync(device)
        if i >= 3:
            total = 0.0
            for j, (p, start, host) in enumerate(marks):
                gpu = _between(start, marks[j + 1][1] if j + 1 < len(marks) else None, device)
                out[p][0].append(gpu)
                out[p][1].append(host)
                total += gpu
            out["step"][0].append(total)
            out["step"][1].append(sum(m[2] for m in marks))
        layer.zero_grad(set_to_none=True)
        x.grad = None
    return out


def _run_pass(variant, p, layer, x, dy, state, deferral):
    """One pass; returns what the next pass needs."""
    if p == "forward":
        return layer(x)
    if p == "backward":
        state.backward(dy)
        return None
    if variant == "deferred":
        if p == "input":
            deferral.defer = True
            state.backward(dy)
            deferral.defer = False
        else:
            deferral.flush()
        return None
    if p == "input":
        _, halves = stage_backward_input([state], [dy], [x], layer.parameters())
        return halves
    stage_backward_weight(layer.parameters(), state)
    return None


def _between(start, end, device) -> float:
    """Seconds from one mark to the next (or to now, for the last)."""
    if end is None:
        return elapsed(start, device)
    if device.type == "cuda":
        return start.elapsed_time(end) / 1e3
    return end - start


def overlap_rows(device: torch.device, quick: bool, repeats: int) -> list[dict]:
    if device.type != "cuda":
        return []
    try:  # Triton: imported where a GPU runs it
        from ._sm_copy import SmCopy
    except ImportError:
        from _sm_copy import SmCopy  # type: ignore[no-redef]
    rows = []
    n = (1 << 30) // 2  # 1 GiB of bf16 each way: many times the L2
    copy = SmCopy(torch.randn(n, device=device, dtype=torch.bfloat16))
    for m, nn_, k in ((1024, 1024, 1024),) if quick else OVERLAP_GEMMS:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, nn_, device=device, dtype=torch.bfloat16)
        alone = _gemm_samples(a, b, repeats, device)
        base = sorted(alone)[len(alone) // 2]
        shape = dict(sweep="overlap", m=m, n=nn_, k=k)
        rows.append(row("gemm", alone, 2.0 * m * nn_ * k, **shape, sms=0, variant="alone"))
        _gemm_beside_copy(a, b, copy, OVERLAP_SMS[0], 1, base, device)  # warm: builds, loads
        for sms in OVERLAP_SMS:
            samples, note, gbps = _gemm_beside_copy(a, b, copy, sms, repeats, base, device)
            r = row("gemm", samples, 2.0 * m * nn_ * k, **shape, sms=sms, variant="beside copy")
            r.update(slowdown=r["seconds"] / base - 1, gbps=gbps, note=note)
            rows.append(r)
    return rows


def _gemm_samples(a, b, repeats, device) -> list[float]:
    inner = 10
    for _ in range(3):
        a @ b
    out = []
    for _ in range(repeats):
        start = clock(device)
        for _ in range(inner):
            a @ b
        out.append(elapsed(start, device) / inner)
    return out


def _gemm_beside_copy(a, b, copy, sms, repeats, base, device):
    """GEMM samples while ``copy`` holds ``sms`` SMs on a side stream for longer than they run,
    a note if it ended first, and the bandwidth the copy reached meanwhile."""
    inner = 10
    rounds = math.ceil(2.0 * (repeats + 3) * inner * base / copy.seconds_per_round(sms)) + 1
    side = torch.cuda.Stream()
    sync(device)
    with torch.cuda.stream(side):
        copy_start = clock(device)
        copy.run(sms, rounds)
        copy_end = torch.cuda.Event(enable_timing=True)
        copy_end.record()
    torch.cuda._sleep(1_000_000)  # about 0.5 ms: the copy's blocks take their SMs first
    samples, last = [], None
    for i in range(repeats + 3):
        start = clock(device)
        for _ in range(inner):
            a @ b
        last = torch.cuda.Event(enable_timing=True)
        last.record()
        if i >= 3:
            samples.append((start, last))
    sync(device)
    copy_s = copy_start.elapsed_time(copy_end) / 1e3
    note = "" if copy_start.elapsed_time(last) < copy_start.elapsed_time(copy_end) \
        else "copy ended before the GEMMs"
    return ([s.elapsed_time(e) / 1e3 / inner for s, e in samples], note,
            copy.bytes_per_round * rounds / copy_s / 1e9)


def main(argv: list[str] | None = None) -> int:
    parser = sweep_parser("python -m clustersim.validation.layer_kernels", __doc__,
                          "folder for layers.csv", "a tiny layer: a script check")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="run both sweeps N times over (run-to-run spread; default 1)")
    args, device = start_sweep(parser, argv, "the layer sweeps need")
    if device is None:
        return 2
    repeats = 3 if args.quick else 20
    rows: list[dict] = []
    for round_ in range(1, args.rounds + 1):
        for name, sweep in (("split backward", layer_rows), ("overlap", overlap_rows)):
            print(f"layer_kernels: round {round_}, {name} on "
                  f"{device_info(device).get('name', device)} ...", file=sys.stderr, flush=True)
            rows += [dict(r, round=round_) for r in sweep(device, args.quick, repeats)]
            write_csv(args.out / "layers.csv", FIELDS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
