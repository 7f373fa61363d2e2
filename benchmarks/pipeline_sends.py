"""What asynchronous pipeline sends change in the held-out tables' interleaved runs.

    python benchmarks/pipeline_sends.py

Megatron-LM's interleaved schedule, NeMo's interleaved recipes and NVIDIA's MLPerf GPT-3 runs
overlap their pipeline sends with compute (``parallel.overlap_p2p_comm``, docs/frameworks.md);
until 2026-11-28 the model blocked every send. For each held-out table with runs compared on an
interleaved schedule, their mean |error| and signed mean (above zero: predicted too fast) with
every send blocking and as the scenarios resolve today, under the same shipped profiles, and
the share of the step the blocking sends took on its busiest stage.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.validation import published as pub

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
TABLES = sorted(DATA.glob("heldout-*.yaml"))


def predict(s, profile):
    return simulate(s, "representative", profile)


def interleaved(rows: list[pub.Row]) -> list[pub.Row]:
    return [r for r in rows if (r.scenario or r.case.scenario).parallel.schedule == "interleaved"]


def pp_share(row: pub.Row) -> float:
    """The busiest stage's exposed pipeline-send time over the step."""
    result = predict(row.scenario or row.case.scenario, pub.profile_of(row.case))
    return max(stage.comm["pp"] for stage in result.stages) / result.step_time_s


def summary(rows: list[pub.Row]) -> str:
    errors = [r.error for r in rows]
    return (f"{100 * sum(map(abs, errors)) / len(errors):5.1f}% "
            f"{100 * sum(errors) / len(errors):+6.1f}%")


def main() -> None:
    print("held-out interleaved runs: mean |error| and signed mean (above zero: predicted too "
          "fast), sends blocking, then as resolved today")
    print(f"{'table':36s} {'runs':>4s} {'blocking':>14s} {'today':>14s} {'blocking sends':>15s}")
    for path in TABLES:
        blocking = interleaved(pub.predict_rows(pub.load_table(path, {"overlap_p2p_comm": False}),
                                                predict=predict))
        if not blocking:
            continue
        today = interleaved(pub.predict_rows(pub.load_table(path), predict=predict))
        shares = [pp_share(r) for r in blocking]
        print(f"{path.stem:36s} {len(blocking):4d} {summary(blocking):>14s} {summary(today):>14s} "
              f"{100 * min(shares):6.1f}-{100 * max(shares):.1f}%")


if __name__ == "__main__":
    main()
