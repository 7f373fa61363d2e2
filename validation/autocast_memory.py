"""What a layer and the loss keep for backward under bf16 autocast over fp32 parameters, the
harness's mixed precision (plain PyTorch AMP, Hugging Face's Trainer), against the same layer
in bf16 throughout (docs/memory.md).

    python -m clustersim.validation.autocast_memory --out DIR [--quick]
    python3 validation/autocast_memory.py --out DIR     # on a GPU machine without clustersim

The harness's single-GPU GPT runs peaked 5-9% above the engine's tensors, which were
Megatron-Core's in bf16 (``training.autocast`` now charges what this measured). Autocast casts
each GEMM's operands to bf16 but leaves the residual stream, the layer norms and the loss in
fp32. For the harness's three GPT shapes this writes
``autocast.csv``: per layer, the bytes a forward leaves allocated under autocast (fp32 layer
and fp32 input, as the harness's blocks see them) and in bf16 throughout, and the bf16 weight
copies autocast keeps among them (its cast cache, which the GEMMs also save); for the output
layer and cross-entropy, the bytes the loss's forward leaves allocated under autocast.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .kernels import device_info, start_sweep, sweep_parser, sync, write_csv
    from .layer_kernels import LayerShard
except ImportError:  # run as a file on a machine where clustersim is not installed
    from kernels import (  # type: ignore[no-redef]
        device_info,
        start_sweep,
        sweep_parser,
        sync,
        write_csv,
    )
    from layer_kernels import LayerShard  # type: ignore[no-redef]

# (name, hidden, ffn_hidden, heads, vocab, sequence, micro-batch): the harness's GPU runs
SHAPES = (("gpt-1.3b", 2048, 8192, 16, 32768, 2048, 4),
          ("gpt-2.7b", 2560, 10240, 32, 32768, 2048, 2),
          ("gpt-6.7b", 4096, 16384, 32, 32768, 2048, 1))
QUICK_SHAPES = (("quick", 64, 256, 4, 512, 32, 2),)
FIELDS = ("name", "hidden", "ffn", "heads", "vocab", "seq", "batch", "layer_autocast_bytes",
          "layer_bf16_bytes", "weight_casts_bytes", "loss_autocast_bytes")


def kept(run, device: torch.device) -> int:
    """Bytes allocated by ``run()`` and still held when it returns (its outputs included)."""
    if device.type != "cuda":
        run()
        return 0
    sync(device)
    before = torch.cuda.memory_allocated(device)
    out = run()
    sync(device)
    held = torch.cuda.memory_allocated(device) - before
    del out
    return held


def shape_row(name, hidden, ffn, heads, vocab, seq, batch, device) -> dict:
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    fp32 = LayerShard(hidden, ffn, heads, 1, None).to(device)
    x32 = torch.randn(batch, seq, hidden, device=device, requires_grad=True)

    def layer_autocast():
        with autocast:
            return fp32(x32)
    casts = 2 * sum(m.weight.numel() for m in fp32.modules() if hasattr(m, "deferral"))
    out_bytes = batch * seq * hidden * 4  # the residual stream leaves the layer in fp32
    layer_autocast_bytes = kept(layer_autocast, device) - out_bytes
    bf16 = LayerShard(hidden, ffn, heads, 1, None).to(device, torch.bfloat16)
    x16 = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16,
                      requires_grad=True)
    layer_bf16_bytes = kept(lambda: bf16(x16), device) - batch * seq * hidden * 2
    head = nn.Linear(hidden, vocab, bias=False).to(device)
    targets = torch.randint(vocab, (batch * seq,), device=device)

    def loss_autocast():
        with autocast:
            return F.cross_entropy(head(x32).view(-1, vocab), targets)
    loss_bytes = kept(loss_autocast, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(name=name, hidden=hidden, ffn=ffn, heads=heads, vocab=vocab, seq=seq,
                batch=batch, layer_autocast_bytes=layer_autocast_bytes,
                layer_bf16_bytes=layer_bf16_bytes, weight_casts_bytes=casts,
                loss_autocast_bytes=loss_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = sweep_parser("python -m clustersim.validation.autocast_memory", __doc__,
                          "folder for autocast.csv", "a tiny layer: a script check")
    args, device = start_sweep(parser, argv, "the autocast memory sweep needs")
    if device is None:
        return 2
    print(f"autocast_memory: on {device_info(device).get('name', device)} ...",
          file=sys.stderr, flush=True)
    rows = [shape_row(*shape, device) for shape in (QUICK_SHAPES if args.quick else SHAPES)]
    write_csv(args.out / "autocast.csv", FIELDS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
