"""Burst against sustained speed on one GPU: how much slower the same kernels run once the
card has been busy long enough to reach its power limit (issue 23; docs/profiles.md, "Layer
time by size, measured").

    python -m clustersim.validation.clocks --out DIR [--quick]
    python3 validation/clocks.py --out DIR     # on a GPU machine without clustersim

A kernel timed alone after an idle moment runs at the boost clock; a training run keeps the
GPU busy for hours, at whatever clock its power and temperature allow. Each workload (a large
bf16 GEMM, one rank's share of a 1T-parameter layer at tp 8, GPT-3 1.3B's layer) is timed
both ways with CUDA events: ``burst``, single calls each after half a second idle; and
``sustained``, calls back to back for several seconds, the last half kept. ``nvidia-smi``
samples the SM clock, power and temperature every 100 ms meanwhile. Writes ``clocks.csv``
(one row per workload and phase, with the clock and power sampled during it) and
``smi.csv`` (the raw samples).
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

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

SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
FIELDS = ("round", "workload", "phase", "calls", "seconds", "p10_s", "p90_s", "start_s",
          "end_s", "sm_mhz", "power_w", "temperature_c", "reasons")


def workloads(device: torch.device, quick: bool) -> dict[str, Callable[[], object]]:
    """Each workload as one call: a forward and backward of a layer shard, or one GEMM."""
    shapes = {"layer quick tp2": (64, 256, 4, 2, 32, 2)} if quick else {
        "layer 1t tp8": (25600, 102400, 160, 8, 2048, 1),
        "layer gpt-1.3b tp1 mbs4": (2048, 8192, 16, 1, 2048, 4)}
    out = {}
    n = 256 if quick else 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    out[f"gemm {n}^3"] = lambda: a @ b
    for name, (hidden, ffn, heads, tp, seq, batch) in shapes.items():
        layer = LayerShard(hidden, ffn, heads, tp, None).to(device, torch.bfloat16)
        x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16,
                        requires_grad=True)
        dy = torch.randn_like(x)

        def step(layer=layer, x=x, dy=dy):
            layer(x).backward(dy)
            layer.zero_grad(set_to_none=True)
            x.grad = None
        out[name] = step
    return out


def timed(fn, device: torch.device) -> float:
    """One call's GPU seconds between CUDA events (host clock on CPUs)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def burst(fn, device, calls: int, idle_s: float) -> list[float]:
    samples = []
    for _ in range(calls):
        time.sleep(idle_s)
        samples.append(timed(fn, device))
    return samples


def sustained(fn, device, seconds: float) -> list[float]:
    """Calls back to back for ``seconds``; the samples of the second half."""
    marks = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            marks.append((time.perf_counter() - start, begin, end))
            if len(marks) % 8 == 0:
                end.synchronize()  # keep the host within a few calls of the GPU
        else:
            t = time.perf_counter()
            fn()
            marks.append((t - start, t, time.perf_counter()))
    sync(device)
    kept = [m for m in marks if m[0] >= seconds / 2] or marks[-1:]  # a slow call: the last
    if device.type == "cuda":
        return [b.elapsed_time(e) / 1e3 for _, b, e in kept]
    return [e - b for _, b, e in kept]


def start_smi(path: Path) -> subprocess.Popen | None:
    """``nvidia-smi`` sampling every 100 ms into ``path``, or None where it is missing."""
    try:
        return subprocess.Popen(["nvidia-smi", f"--query-gpu=timestamp,{SMI_FIELDS}",
                                 "--format=csv,nounits", "-lms", "100"],
                                stdout=path.open("w"), stderr=subprocess.DEVNULL)
    except OSError:
        return None


def smi_samples(path: Path, epoch: float) -> list[tuple[float, list[str]]]:
    """(seconds since ``epoch``, the row's fields) of each sample."""
    out = []
    if not path.exists():
        return out
    with path.open() as f:
        for fields in csv.reader(f):
            try:
                t = time.mktime(time.strptime(fields[0].strip()[:19], "%Y/%m/%d %H:%M:%S"))
                t += float("0." + fields[0].strip().split(".")[1]) if "." in fields[0] else 0
            except (ValueError, IndexError):
                continue
            out.append((t - epoch, [x.strip() for x in fields[1:]]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = sweep_parser("python -m clustersim.validation.clocks", __doc__,
                          "folder for clocks.csv", "tiny workloads: a script check")
    parser.add_argument("--rounds", type=int, default=2, metavar="N")
    args, device = start_sweep(parser, argv, "the clock sweep needs")
    if device is None:
        return 2
    calls, idle, hold = (3, 0.01, 0.05) if args.quick else (10, 0.5, 8.0)
    epoch = time.time()
    smi = start_smi(args.out / "smi.csv") if device.type == "cuda" else None
    rows = []
    try:
        work = workloads(device, args.quick)
        for fn in work.values():
            fn()
        sync(device)
        for round_ in range(1, args.rounds + 1):
            for name, fn in work.items():
                print(f"clocks: round {round_}, {name} on "
                      f"{device_info(device).get('name', device)}", file=sys.stderr, flush=True)
                for phase in ("burst", "sustained"):
                    begin = time.time() - epoch
                    samples = burst(fn, device, calls, idle) if phase == "burst" \
                        else sustained(fn, device, hold)
                    end = time.time() - epoch
                    if phase == "sustained":
                        begin = (begin + end) / 2
                    rows.append(dict(round=round_, workload=name, phase=phase,
                                     calls=len(samples), start_s=begin, end_s=end,
                                     **_quantiles(samples)))
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
    _attach_smi(rows, smi_samples(args.out / "smi.csv", epoch))
    write_csv(args.out / "clocks.csv", FIELDS, rows)
    return 0


def _quantiles(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    return {"seconds": statistics.median(samples), "p10_s": q[0], "p90_s": q[-1]}


def _attach_smi(rows: list[dict], samples: list[tuple[float, list[str]]]) -> None:
    """Each row's median SM clock, power and temperature over the samples inside it (for
    ``burst``, whatever the card did between calls counts too: idle moments lower it)."""
    for r in rows:
        inside = [f for t, f in samples if r["start_s"] <= t <= r["end_s"]]
        for key, i in (("sm_mhz", 0), ("power_w", 2), ("temperature_c", 3)):
            values = [float(f[i]) for f in inside if len(f) > i and _number(f[i])]
            r[key] = statistics.median(values) if values else ""
        r["reasons"] = " ".join(sorted({f[4] for f in inside if len(f) > 4}))


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
