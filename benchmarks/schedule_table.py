"""Every shipped pipeline schedule on the same split (docs/modelling.md, "Every shipped schedule
on that example"): step, bubble, exposed communication and the busiest stage's peak memory of
``examples/zero-bubble-h1.yaml`` under each, as ``examples/zero-bubble-timelines.sh`` draws them.

    python3 benchmarks/schedule_table.py
"""

from __future__ import annotations

from pathlib import Path

import clustersim

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "zero-bubble-h1.yaml"
# (schedule, chunks per rank) as the timelines script runs them
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1),
             ("zb-v", 2), ("dualpipev", 2), ("dualpipe", 2))


def main() -> None:
    print(f"{'schedule':14s} {'step':>8s} {'compute':>8s} {'bubble':>7s} {'exposed comm':>13s}"
          f" {'optimizer':>10s} {'peak memory':>12s}")
    for name, chunks in SCHEDULES:
        r = clustersim.simulate(str(EXAMPLE), parallel__schedule=name,
                                parallel__virtual_stages=chunks).to_dict()
        b = r["breakdown_s"]
        label = f"{name} x{chunks}" if name == "interleaved" else name
        print(f"{label:14s} {r['step_time_s']:6.3f} s {b['compute'] * 1e3:5.0f} ms"
              f" {b['bubble'] * 1e3:4.0f} ms {b['exposed_comm'] * 1e3:10.0f} ms"
              f" {b['optimizer'] * 1e3:7.0f} ms {r['memory']['peak_bytes'] / 2**30:8.1f} GiB")


if __name__ == "__main__":
    main()
