"""One tensor-parallel rank's share of a GPT layer at the sizes the development set trains,
timed on one GPU with its kernel time split by family (issue 23; docs/profiles.md, "Layer
time by size, measured").

    python -m clustersim.validation.layer_sizes --out DIR [--quick] [--rounds N]
    python3 validation/layer_sizes.py --out DIR     # on a GPU machine without clustersim

The development set's errors follow model size (large models predicted slow, small ones
fast, on A100). This sweep asks whether the same trend shows on one GPU, kernel by kernel:
the shards of Korthikanti et al.'s 22B-1T runs and vTrain's 3.6B-175B splits, bf16,
sequence 2048. Writes two files:

- ``sizes.csv``: per shard and pass (forward, backward, step), the GPU time (CUDA events,
  median and 10th / 90th percentile of 20 iterations after 3 warm-ups), the host's time to
  issue it, the sum of its kernels' own times by family (``gemm_s``, ``attention_s``,
  ``other_s``: the PyTorch profiler's CUDA events of one more iteration) and the bytes the
  forward leaves allocated for backward (``saved_bytes``).
- ``kernels.csv``: the profiler's raw kernel names, counts and times behind the families, so
  another grouping can be read off later.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch

try:
    from .kernels import device_info, row, start_sweep, sweep_parser, sync, write_csv
    from .layer_kernels import LayerShard, time_passes
except ImportError:  # run as a file on a machine where clustersim is not installed
    from kernels import (  # type: ignore[no-redef]
        device_info,
        row,
        start_sweep,
        sweep_parser,
        sync,
        write_csv,
    )
    from layer_kernels import LayerShard, time_passes  # type: ignore[no-redef]

# (name, hidden, ffn_hidden, heads, tp, sequence, micro-batch): the development set's shards
SIZES = (("gpt-1.3b tp1 mbs4", 2048, 8192, 16, 1, 2048, 4),
         ("vtrain-3.6b tp4 mbs2", 3072, 12288, 32, 4, 2048, 2),
         ("vtrain-3.6b tp8 mbs2", 3072, 12288, 32, 8, 2048, 2),
         ("vtrain-18.4b tp16 mbs2", 6144, 24576, 48, 16, 2048, 2),
         ("korthikanti-22b tp8", 6144, 24576, 64, 8, 2048, 1),
         ("vtrain-39.1b tp2 mbs2", 8192, 32768, 64, 2, 2048, 2),
         ("vtrain-39.1b tp4 mbs3", 8192, 32768, 64, 4, 2048, 3),
         ("korthikanti-175b tp8", 12288, 49152, 96, 8, 2048, 1),
         ("vtrain-175b tp4 mbs2", 12288, 49152, 96, 4, 2048, 2),
         ("vtrain-175b tp2 mbs2", 12288, 49152, 96, 2, 2048, 2),
         ("korthikanti-530b tp8", 20480, 81920, 128, 8, 2048, 1),
         ("korthikanti-1t tp8", 25600, 102400, 160, 8, 2048, 1))
QUICK_SIZES = (("quick", 64, 256, 4, 2, 32, 2),)
FIELDS = ("round", "name", "pass", "hidden", "ffn", "heads", "tp", "seq", "batch", "seconds",
          "p10_s", "p90_s", "host_s", "tflops", "gemm_s", "attention_s", "other_s",
          "kernels", "saved_bytes")
KERNEL_FIELDS = ("round", "name", "pass", "kernel", "family", "count", "seconds")


def family(kernel: str) -> str:
    """A kernel's family by its name: cuBLAS / CUTLASS matrix products, flash or cuDNN
    attention, everything else (norms, GELU, adds, copies, fills)."""
    name = kernel.lower()
    if any(k in name for k in ("flash", "fmha", "sdpa", "attention", "attn")):
        return "attention"
    if any(k in name for k in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul")):
        return "gemm"
    return "other"


def size_rows(device: torch.device, quick: bool, repeats: int) -> tuple[list[dict], list[dict]]:
    rows, kernel_rows = [], []
    for name, hidden, ffn, heads, tp, seq, batch in (QUICK_SIZES if quick else SIZES):
        shape = dict(name=name, hidden=hidden, ffn=ffn, heads=heads, tp=tp, seq=seq, batch=batch)
        weights = (4 * hidden * hidden + 2 * hidden * ffn) / tp
        samples = time_passes("whole", hidden, ffn, heads, tp, seq, batch, device, repeats)
        kernels, saved = profile_layer(hidden, ffn, heads, tp, seq, batch, device)
        for pass_, (gpu, host) in samples.items():
            flops = {"forward": 2.0, "backward": 4.0, "step": 6.0}[pass_] * batch * seq * weights
            r = row("layer", gpu, flops, **shape, **{"pass": pass_})
            r["host_s"] = sorted(host)[len(host) // 2]
            by_family: dict[str, float] = defaultdict(float)
            passes = ("forward", "backward") if pass_ == "step" else (pass_,)
            for (p, kernel), (_, seconds) in kernels.items():
                if p in passes:
                    by_family[family(kernel)] += seconds
            r.update({f"{f}_s": by_family[f] for f in ("gemm", "attention", "other")})
            r["kernels"] = sum(c for (p, _), (c, _) in kernels.items() if p in passes)
            r["saved_bytes"] = saved
            rows.append(r)
        kernel_rows += [dict(shape, kernel=k, family=family(k), count=c, seconds=s,
                             **{"pass": p}) for (p, k), (c, s) in kernels.items()]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, kernel_rows


def profile_layer(hidden, ffn, heads, tp, seq, batch, device):
    """({(pass, kernel): (count, seconds)}, bytes the forward keeps for backward) of one warm
    forward and backward. The kernel times are the profiler's own, free of host gaps."""
    layer = LayerShard(hidden, ffn, heads, tp, None).to(device, torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    layer(x).backward(dy)  # warm: the first pass allocates and picks kernels
    layer.zero_grad(set_to_none=True)
    x.grad = None
    sync(device)
    if device.type != "cuda":
        return {}, 0
    from torch.profiler import ProfilerActivity, profile
    out: dict[tuple[str, str], tuple[int, float]] = {}
    before = torch.cuda.memory_allocated(device)
    for pass_ in ("forward", "backward"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            if pass_ == "forward":
                y = layer(x)
            else:
                y.backward(dy)
            sync(device)
        if pass_ == "forward":  # what stays allocated: saved tensors plus the output itself
            saved = torch.cuda.memory_allocated(device) - before - y.numel() * y.element_size()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                count, seconds = out.get((pass_, e.name), (0, 0.0))
                out[(pass_, e.name)] = (count + 1, seconds + e.time_range.elapsed_us() / 1e6)
    return out, saved


def main(argv: list[str] | None = None) -> int:
    parser = sweep_parser("python -m clustersim.validation.layer_sizes", __doc__,
                          "folder for sizes.csv", "a tiny layer: a script check")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="run the sweep N times over (run-to-run spread; default 1)")
    args, device = start_sweep(parser, argv, "the layer size sweep needs")
    if device is None:
        return 2
    rows: list[dict] = []
    kernel_rows: list[dict] = []
    for round_ in range(1, args.rounds + 1):
        print(f"layer_sizes: round {round_} on {device_info(device).get('name', device)} ...",
              file=sys.stderr, flush=True)
        new, new_kernels = size_rows(device, args.quick, 3 if args.quick else 20)
        rows += [dict(r, round=round_) for r in new]
        kernel_rows += [dict(r, round=round_) for r in new_kernels]
        write_csv(args.out / "sizes.csv", FIELDS, rows)
        write_csv(args.out / "kernels.csv", KERNEL_FIELDS, kernel_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
