"""Time gloo's all-reduce, all-gather and reduce-scatter on this machine, by message size.

    python3 benchmarks/gloo_collectives.py [--ranks 2] [--repeats 50]

Each collective runs ``repeats`` times after a warm-up, on every rank at once, and the mean per
call is printed (rank 0's). The sizes are the collective's whole tensor: what an all-reduce
reduces, what an all-gather gathers, what a reduce-scatter scatters. On gloo the
reduce-scatter (``dist.reduce_scatter``) is no ring's half of an all-reduce (NOTES.md, C1);
the harness reduce-scatters by an all-to-all and a local sum instead
(``validation/tensor_parallel.reduce_scatter``), the last column (docs/validation.md,
"Context parallelism, run for real").
"""

from __future__ import annotations

import argparse
import sys
import time

SIZES = (1 << 16, 1 << 18, 1 << 20)  # float32 elements: 256 KB, 1 MB, 4 MB


def _time(fn, repeats: int) -> float:
    import torch.distributed as dist
    for _ in range(5):
        fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def _row(n: int, world: int, repeats: int) -> dict[str, float]:
    """Seconds per call of each collective over ``n`` float32 elements."""
    import torch
    import torch.distributed as dist
    whole = torch.randn(n)
    parts = [torch.randn(n // world) for _ in range(world)]
    mine = torch.empty(n // world)
    from clustersim.validation.tensor_parallel import reduce_scatter
    return {"all-reduce": _time(lambda: dist.all_reduce(whole), repeats),
            "all-gather": _time(lambda: dist.all_gather(parts, mine), repeats),
            "reduce-scatter": _time(lambda: dist.reduce_scatter(mine, parts), repeats),
            "harness": _time(lambda: reduce_scatter(parts, None), repeats)}


def collectives(rank: int, world: int, repeats: int) -> dict:
    return {n * 4: _row(n, world, repeats) for n in SIZES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    from clustersim.validation.launch import run_ranks
    times = run_ranks(collectives, a.ranks, a.repeats, timeout=300)[0]
    print(f"{'bytes':>9s} {'all-reduce':>11s} {'all-gather':>11s} {'reduce-scatter':>15s} "
          f"{'harness RS':>11s}")
    for nbytes, row in times.items():
        print(f"{nbytes:9d} {1e3 * row['all-reduce']:9.2f}ms {1e3 * row['all-gather']:9.2f}ms "
              f"{1e3 * row['reduce-scatter']:13.2f}ms {1e3 * row['harness']:9.2f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
