"""Was the machine quiet while it measured? A calibration's kernels are timed in several rounds
and a validation run's steps several times; when those repeats disagree by more than a
threshold the machine was busy, and the command says so (a warning, not an error: the median is
still reported). Torch-free, so the commands' warnings are tested without it.
"""

from __future__ import annotations

import statistics

# Kernel timings whose rounds differ by more than this (median over kernels) were taken on a busy
# machine: the calibrate command warns, as validate does for step times (NOISY_SPREAD).
NOISY_ROUNDS = 0.15


def round_noise(rows: list[dict]) -> float:
    """Median over kernels of (slowest round - fastest round) / fastest round."""
    spreads = [r["round_spread"] / r["seconds"] for r in rows
               if r["kind"] != "collective" and r.get("round_spread") is not None]
    return statistics.median(spreads) if spreads else 0.0


NOISY_SPREAD = 0.10  # half the spread over the mean step time: ±10% is no longer a measurement


def spread_warning(measured: dict, steps: int) -> str | None:
    """A warning when the timed steps disagree by more than ±10%, and how to get a quiet
    measurement; None when they agree."""
    half = measured["step_time_spread_s"] / 2
    mean = measured["step_time_s"]
    if mean <= 0 or half / mean <= NOISY_SPREAD:
        return None
    return (f"warning: step times varied by ±{half:.2f} s on {mean:.2f} s ({half / mean:.0%}): "
            "the machine was busy, so the comparison is uncertain. For a quiet measurement "
            "stop other work on this machine (check with 'top'), then run again with more "
            f"steps (--steps {max(2 * steps, 12)}); the median step is reported either way.")
