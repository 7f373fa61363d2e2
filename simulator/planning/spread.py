"""Step time with error bars: a scenario predicted under profiles drawn from their uncertainty.

``simulate --samples N`` predicts the step N times, each under a profile whose uncertain
figures are drawn from their lognormal spreads (``topologies/uncertainty.py``), and reports the
median and the 90% interval (5th to 95th percentile) of the step time and the time to train.
A seeded ``random.Random`` makes the draws, so the same seed gives the same interval; a
profile with no uncertainty gives N equal predictions, an interval of zero width.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from clustersim.topologies.profile import Profile
from clustersim.topologies.uncertainty import sampled_profile

from ..costs.result import StepResult


@dataclass(frozen=True)
class Spread:
    """Quantiles of N predictions: (5th percentile, median, 95th percentile)."""

    samples: int
    seed: int
    step_time_s: tuple[float, float, float]
    time_to_train_s: tuple[float, float, float] | None
    drawn: tuple[str, ...] = ()  # the profile's figures that carried a spread

    def as_json(self) -> dict:
        lo, median, hi = self.step_time_s
        out = {"samples": self.samples, "seed": self.seed, "step_time_median_s": median,
               "step_time_interval_s": [lo, hi], "time_to_train_interval_s": None}
        if self.time_to_train_s is not None:
            out["time_to_train_interval_s"] = [self.time_to_train_s[0], self.time_to_train_s[2]]
        return out


def spread(predict: Callable[[Profile], StepResult], profile: Profile, samples: int,
           seed: int = 0) -> Spread:
    """Predict with ``samples`` draws of ``profile`` and summarise the step times."""
    if samples < 2:
        raise ValueError(f"samples must be at least 2 for an interval (got {samples})")
    rng = random.Random(seed)
    results = [predict(sampled_profile(profile, rng)) for _ in range(samples)]
    to_train = [r.time_to_train_s for r in results]
    return Spread(samples, seed, _quantiles([r.step_time_s for r in results]),
                  None if None in to_train else _quantiles(to_train),
                  tuple(sorted(profile.uncertainty)))


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """5th percentile, median, 95th percentile, linearly interpolated (numpy's default)."""
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return cuts[0], statistics.median(values), cuts[-1]
