"""Kernel sweeps on one GPU: the per-operation measurements a profile is derived from.

    python -m clustersim.validation.kernels --out DIR [--quick]

Writes ``DIR/kernels.csv`` (one row per kernel and shape) and ``DIR/device.json`` (what ran
it). Measured, each on random data (zeros run faster, METHOD.md of the device tool):

- **HBM**: a large device-to-device copy, bytes read plus bytes written over time;
- **bf16 GEMMs** of transformer layers (QKV, attention output, MLP up and down) at tp 1 and
  8, over token counts, as PyTorch's ``nn.Linear`` issues them: forward ``x W^T``, the data
  gradient ``dy W`` and the weight gradient ``dy^T x``;
- **FP8 GEMMs** (``torch._scaled_mm``, E4M3, per-tensor scales, bf16 out), beside
  DeepGEMM's published shape (4096 x 7168 x 16384) that ``gemm.fp8_ceiling`` comes from;
- **attention**: causal ``scaled_dot_product_attention`` forward and forward + backward, bf16,
  per backend (FlashAttention, cuDNN), over sequence lengths and head sizes. FLOPs follow the
  FlashAttention papers: forward ``4 b h s^2 d / 2`` causal, backward 2.5 times the forward.

Each figure is the median of repeated timings with CUDA events after a warm-up, with the
10th and 90th percentiles beside it (the spread). ``--quick`` runs tiny shapes on whatever
device there is (the CPU in tests): a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

# (name, hidden, ffn_hidden, q heads, kv heads): widths of the models the project plans for.
MODELS = (("gpt-1.3b", 2048, 8192, 16, 16), ("llama3-8b", 4096, 14336, 32, 8),
          ("llama3-70b", 8192, 28672, 64, 8), ("gpt3-175b", 12288, 49152, 96, 96))
TOKENS = (2048, 8192, 16384)
TP = (1, 8)
FP8_SHAPES = ((4096, 7168, 16384), (8192, 8192, 8192), (16384, 8192, 28672 // 8),
              (16384, 28672 // 8, 8192))
SEQS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
ATTENTION_TOKENS = 16384  # batch x sequence per attention call, 4096 wide (32 x 128, 64 x 64)
FIELDS = ("op", "dtype", "backend", "pass", "m", "n", "k", "batch", "heads", "seq",
          "head_dim", "flops", "bytes", "seconds", "p10_s", "p90_s", "tflops", "gbps", "error")


def time_op(fn: Callable[[], object], device: torch.device, repeats: int = 20) -> list[float]:
    """Seconds per call, ``repeats`` samples; each sample is a batch of calls long enough
    (about 1 ms) that the launch gap and event resolution do not count."""
    fn()
    sync(device)
    start = clock(device)
    fn()
    once = max(elapsed(start, device), 1e-6)
    inner = max(1, min(100, math.ceil(1e-3 / once)))
    for _ in range(2):  # warm-up: clocks up, caches and autotuning settled
        fn()
    samples = []
    for _ in range(repeats):
        start = clock(device)
        for _ in range(inner):
            fn()
        samples.append(elapsed(start, device) / inner)
    return samples


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device):
    """A start mark: a recorded CUDA event, or the host clock after a sync on CPUs."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed(start, device: torch.device) -> float:
    if device.type == "cuda":
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return time.perf_counter() - start


def row(op: str, samples: list[float], flops: float = 0.0, nbytes: float = 0.0,
        **shape) -> dict:
    """One CSV row: the median and the 10th / 90th percentiles, and rates at the median."""
    q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    median = statistics.median(samples)
    return {"op": op, **shape, "flops": flops, "bytes": nbytes, "seconds": median,
            "p10_s": q[0], "p90_s": q[-1], "tflops": flops / median / 1e12 if flops else "",
            "gbps": nbytes / median / 1e9 if nbytes else ""}


def gemm_shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """(label, tokens m, out features n, in features k) of each layer GEMM, deduplicated."""
    if quick:
        return [("quick", 64, 96, 128)]
    seen, out = set(), []
    for name, h, ffn, heads, kv in MODELS:
        qkv = h + 2 * kv * (h // heads)
        for tp in TP:
            for label, n, k in (("qkv", qkv // tp, h), ("proj", h, h // tp),
                                ("up", ffn // tp, h), ("down", h, ffn // tp)):
                for m in TOKENS:
                    if (m, n, k) not in seen:
                        seen.add((m, n, k))
                        out.append((f"{name} tp{tp} {label}", m, n, k))
    return out


def gemm_rows(device: torch.device, quick: bool) -> list[dict]:
    """Forward, data-gradient and weight-gradient products of each layer GEMM in bf16."""
    rows = []
    for label, m, n, k in gemm_shapes(quick):
        for name, fn in _layer_products(m, n, k, device).items():
            rows.append(row("gemm", time_op(fn, device), 2.0 * m * n * k,
                            2.0 * (m * k + n * k + m * n), dtype="bf16", backend=label,
                            **{"pass": name}, m=m, n=n, k=k))
    return rows


def _layer_products(m: int, n: int, k: int, device: torch.device) -> dict[str, Callable]:
    """``nn.Linear``'s three products on fresh random operands: x (m, k), W (n, k), dy (m, n)."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    return {"forward": lambda: x @ w.t(), "dgrad": lambda: dy @ w, "wgrad": lambda: dy.t() @ x}


def fp8_rows(device: torch.device, quick: bool) -> list[dict]:
    """FP8 E4M3 GEMMs through ``torch._scaled_mm`` (B column-major, as cuBLASLt requires)."""
    shapes = ((64, 64, 64),) if quick else FP8_SHAPES
    rows = []
    for m, n, k in shapes:
        shape = {"dtype": "fp8-e4m3", "backend": "torch._scaled_mm", "pass": "forward",
                 "m": m, "n": n, "k": k}
        try:
            rows.append(row("gemm", time_op(_fp8_product(m, n, k, device), device),
                            2.0 * m * n * k, m * k + n * k + 2.0 * m * n, **shape))
        except (RuntimeError, TypeError, AttributeError) as e:  # no FP8 on this device
            rows.append({"op": "gemm", **shape, "error": str(e).splitlines()[0][:200]})
    return rows


def _fp8_product(m: int, n: int, k: int, device: torch.device) -> Callable:
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def attention_rows(device: torch.device, quick: bool) -> list[dict]:
    """Causal attention forward and forward + backward, per SDPA backend, bf16."""
    from torch.nn.attention import SDPBackend
    backends = {"default": None}
    if device.type == "cuda":
        backends.update(flash=SDPBackend.FLASH_ATTENTION, cudnn=SDPBackend.CUDNN_ATTENTION)
    seqs, dims, tokens = ((64,), (16,), 128) if quick else (SEQS, HEAD_DIMS, ATTENTION_TOKENS)
    rows = []
    for seq in seqs:
        for d in dims:
            b, heads = max(1, tokens // seq), 4096 // d if not quick else 2
            shape = {"dtype": "bf16", "batch": b, "heads": heads, "seq": seq, "head_dim": d}
            q, k, v = (torch.randn(b, heads, seq, d, device=device, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn_like(q)
            forward_flops = 4.0 * b * heads * seq * seq * d / 2
            for name, backend in backends.items():
                rows += _attention_passes(q, k, v, grad, backend, forward_flops,
                                          {**shape, "backend": name}, device)
    return rows


def _attention_passes(q, k, v, grad, backend, forward_flops, shape, device) -> list[dict]:
    from torch.nn.attention import sdpa_kernel
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    both = lambda: fwd().backward(grad)  # noqa: E731
    rows = []
    for name, fn, flops in (("forward", fwd, forward_flops),
                            ("forward+backward", both, 3.5 * forward_flops)):
        try:
            if backend is None:
                samples = time_op(fn, device)
            else:
                with sdpa_kernel(backend):
                    samples = time_op(fn, device)
            rows.append(row("attention", samples, flops, **shape, **{"pass": name}))
        except RuntimeError as e:  # the backend refuses this shape or device
            rows.append({"op": "attention", **shape, "pass": name,
                         "error": str(e).splitlines()[0][:200]})
    return rows


def hbm_rows(device: torch.device, quick: bool) -> list[dict]:
    """A device-to-device copy of 4 GiB (bytes read plus bytes written)."""
    n = (1 << 20) if quick else (4 << 30) // 2
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return [row("copy", time_op(lambda: y.copy_(x), device), 0.0, 4.0 * n, dtype="bf16",
                **{"pass": "forward"})]


def device_info(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, multiprocessors=p.multi_processor_count,
                    memory_bytes=p.total_memory, capability=f"{p.major}.{p.minor}")
    return info


def sweep_device(quick: bool, needs: str) -> torch.device | None:
    """The GPU a sweep runs on; the CPU only for ``--quick`` (a script check, never a
    measurement): without a GPU, one ``error:`` line and None."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not quick:
        print(f"error: --quick: {needs} a CUDA GPU (--quick checks the script on the CPU)",
              file=sys.stderr)
        return None
    return device


def main(argv: list[str] | None = None) -> int:
    parser = sweep_parser("python -m clustersim.validation.kernels", __doc__,
                          "folder for kernels.csv", "tiny shapes: a script check")
    args, device = start_sweep(parser, argv, "the kernel sweep needs")
    if device is None:
        return 2
    (args.out / "device.json").write_text(json.dumps(device_info(device), indent=1) + "\n")
    rows: list[dict] = []
    for name, sweep in (("hbm", hbm_rows), ("gemm", gemm_rows), ("fp8", fp8_rows),
                        ("attention", attention_rows)):
        print(f"kernels: {name} ...", file=sys.stderr, flush=True)
        rows += sweep(device, args.quick)
        write_csv(args.out / "kernels.csv", FIELDS, rows)
    return 0


def sweep_parser(prog: str, doc: str, out_help: str, quick_help: str) -> argparse.ArgumentParser:
    """The sweeps' common command line: ``--out DIR`` and ``--quick`` (a script check)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help=out_help)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def start_sweep(parser: argparse.ArgumentParser, argv: list[str] | None,
                needs: str) -> tuple[argparse.Namespace, torch.device | None]:
    """(arguments, the sweep's device) with ``--out`` created; the device is None, after one
    ``error:`` line, where a full sweep finds no GPU."""
    args = parser.parse_args(argv)
    device = sweep_device(args.quick, needs)
    if device is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    return args, device


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """A sweep's rows under ``fields`` (other keys left out); rewritten whole after each sweep,
    so a run cut off keeps what it measured."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _cell(k, v) for k, v in r.items()} for r in rows)


def _cell(key: str, value):
    """Counts exactly; times and rates to six significant figures."""
    if key in ("flops", "bytes") and isinstance(value, float):
        return int(value)
    return f"{value:.6g}" if isinstance(value, float) else value


if __name__ == "__main__":
    sys.exit(main())
