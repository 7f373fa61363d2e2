"""Stragglers: GPUs of one job that compute at different speeds (``cluster.variability``).

A synchronous step waits for its slowest GPU: tensor-parallel collectives every layer, pipeline
sends every micro-batch, the data-parallel gradient reduction every step. With each GPU's
compute time scaled by a factor ``X`` drawn once for the step — lognormal ``exp(sigma z)``,
and with probability ``slow_fraction`` also ``slow_factor`` times slower — a job's pipeline
runs at the pace of its slowest stage in each replica and the step ends with its slowest
replica, so the compute-bound step grows by about the largest of the N GPUs' factors.
Full fidelity draws each GPU's factor (``rank_factors``; a rank standing for its TP group,
``symmetry.py``, takes the group's largest);
representative, which simulates one rank per stage, scales every stage's compute by the
expected maximum of N draws (``expected_max``), an order statistic computed by quadrature.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

from clustersim.topologies.hardware import ClusterSpec, Variability

_GRID = 4000  # quadrature points over the factor's range (relative error < 1e-6 in tests)


def rank_factors(v: Variability | None, ranks: int) -> list[float]:
    """Each GPU's compute-time factor, by global rank; the same seed gives the same GPUs."""
    if v is None:
        return [1.0] * ranks
    rng = random.Random(v.seed)
    return [_draw(v, rng) for _ in range(ranks)]


def _draw(v: Variability, rng: random.Random) -> float:
    factor = math.exp(v.compute_sigma * rng.gauss(0.0, 1.0))
    return factor * (v.slow_factor if rng.random() < v.slow_fraction else 1.0)


def port_factor(v: Variability | None, gpu: int, port: str) -> float:
    """One GPU port's bandwidth divisor ``exp(link_sigma z)`` (median 1: the profile's
    achieved bandwidth), drawn from its own seed so that ports created in any order agree."""
    if v is None or v.link_sigma == 0:
        return 1.0
    return math.exp(v.link_sigma * random.Random(f"{v.seed}/{port}/{gpu}").gauss(0.0, 1.0))


def with_link_jitter(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster as representative sees it under per-port jitter: every tier at its
    expected slowest port, ``bandwidth / E[max of N port divisors]`` for N GPUs, as a
    synchronous step waits for its slowest collective."""
    v = cluster.variability
    if v is None or v.link_sigma == 0:
        return cluster
    slowest = _expected_max(v.link_sigma, 0.0, 1.0, cluster.gpus)
    tiers = {name: getattr(cluster, name) for name in ("intra_node", "inter_node", "spine")}
    return cluster.model_copy(update={
        name: tier.model_copy(update={"bandwidth": tier.bandwidth / slowest})
        for name, tier in tiers.items() if tier is not None})


def expected_max(v: Variability | None, n: int) -> float:
    """E[max of n independent factors] = ∫ (1 - F(x)^n) dx over x > 0, F the factor's CDF."""
    if v is None or (v.compute_sigma == 0 and v.slow_fraction == 0):
        return 1.0
    return _expected_max(v.compute_sigma, v.slow_fraction, v.slow_factor, n)


@lru_cache(maxsize=256)
def _expected_max(sigma: float, fraction: float, slow: float, n: int) -> float:
    if sigma == 0:  # only stragglers: the max is slow if any of the n is one
        return 1.0 + (slow - 1.0) * (1.0 - (1.0 - fraction) ** n)
    # E[max] = a + ∫_a^b (1 - F^n) dx, with F(a) ~ 0 and F(b) ~ 1 (12 sigma either side)
    lo, hi = math.exp(-12 * sigma), slow * math.exp(12 * sigma)
    xs = [lo * (hi / lo) ** (i / _GRID) for i in range(_GRID + 1)]  # log-spaced
    ys = [1.0 - _cdf(x, sigma, fraction, slow) ** n for x in xs]
    area = sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(_GRID))
    return lo + area


def _cdf(x: float, sigma: float, fraction: float, slow: float) -> float:
    def normal(z: float) -> float:
        return 0.5 * math.erfc(-z / math.sqrt(2))
    return ((1 - fraction) * normal(math.log(x) / sigma)
            + fraction * normal(math.log(x / slow) / sigma))
