"""Published peak-memory readings beside clustersim's predicted peak (held out).

    python benchmarks/memory_readings.py

torchtitan's H100 benchmarks print each run's peak reserve (``max_reserved_gib``); the engine
predicts the allocated peak on the busiest rank, which the reserve holds with the caching
allocator's spare blocks on top: a right prediction lies a little under the reading
(``tests/data/memory-torchtitan-h100.yaml``; docs/memory.md). Then the development set's
BLOOM sweep on A100 80GB (2022, Megatron-DeepSpeed), whose chronicles print nvidia-smi's memory
in use on the first and last nodes: the allocated peak plus the process's runtime against it
(the rest is the allocator's cache and NCCL's buffers).
"""

from __future__ import annotations

from pathlib import Path

from clustersim.validation.memory_readings import compare, compare_used, load_readings, load_used

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "memory-torchtitan-h100.yaml"
DEV_SET = DATA.parent / "published-dev.yaml"


def main() -> None:
    readings = load_readings(DATA)
    rows = compare(readings)
    megatron = compare(readings, loss_kernel="vocab_parallel")
    print("torchtitan on H100 (docs/performance.md, Dec 2024): published peak reserve against "
          "the predicted allocated peak;")
    print("last column: the same prediction with Megatron-LM's in-place loss instead of "
          "torchtitan's F.cross_entropy")
    print(f"{'case':42s} {'published GiB':>13s} {'predicted GiB':>13s} {'ratio':>6s} "
          f"{'in-place loss':>13s}")
    for row, other in zip(rows, megatron, strict=True):
        print(f"{row.reading.id:42s} {row.reading.gib:13.1f} "
              f"{row.predicted_gib:13.1f} {row.ratio:6.3f} {other.ratio:13.3f}")
    used = compare_used(load_used(DEV_SET))
    ratios = sorted(row.ratio for row in used)
    print()
    print("BLOOM's topology sweep on A100 80GB (2022): nvidia-smi's memory in use against the "
          "predicted allocated peak plus the runtime;")
    print(f"ratio {ratios[0]:.2f}-{ratios[-1]:.2f}, median {ratios[len(ratios) // 2]:.2f} "
          f"over {len(ratios)} runs")
    print(f"{'case':58s} {'nvidia-smi GiB':>14s} {'predicted GiB':>13s} {'ratio':>6s}")
    for row in used:
        print(f"{row.reading.id:58s} {row.reading.gib:14.1f} {row.predicted_gib:13.1f} "
              f"{row.ratio:6.3f}")


if __name__ == "__main__":
    main()
