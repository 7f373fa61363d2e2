"""Stragglers: a synchronous step waits for its slowest GPU; the expected slowest of N."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.variability import expected_max, rank_factors
from clustersim.topologies.hardware import Variability


def phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


@pytest.mark.parametrize("sigma", [0.01, 0.05, 0.3])
def test_expected_max_of_one_and_two_lognormals_in_closed_form(sigma):
    """E[X] = exp(s^2/2); E[max(X1, X2)] = 2 exp(s^2/2) Phi(s / sqrt 2) for X = exp(s Z)."""
    v = Variability(compute_sigma=sigma)
    assert expected_max(v, 1) == pytest.approx(math.exp(sigma ** 2 / 2), rel=1e-6)
    two = 2 * math.exp(sigma ** 2 / 2) * phi(sigma / math.sqrt(2))
    assert expected_max(v, 2) == pytest.approx(two, rel=1e-6)


def test_expected_max_of_a_straggler_mixture_matches_monte_carlo():
    v = Variability(compute_sigma=0.05, slow_fraction=0.01, slow_factor=1.5)
    rng = random.Random(11)
    n, trials = 64, 4000
    draws = [max(math.exp(0.05 * rng.gauss(0, 1)) * (1.5 if rng.random() < 0.01 else 1.0)
                 for _ in range(n)) for _ in range(trials)]
    assert expected_max(v, n) == pytest.approx(statistics.fmean(draws), rel=0.005)


def test_only_stragglers_is_one_plus_their_chance_of_being_there():
    v = Variability(slow_fraction=0.001, slow_factor=2.0)
    assert expected_max(v, 1024) == pytest.approx(1 + (1 - 0.999 ** 1024))
    nearly = Variability(compute_sigma=1e-4, slow_fraction=0.001, slow_factor=2.0)
    assert expected_max(nearly, 1024) == pytest.approx(expected_max(v, 1024), rel=1e-3)


def test_the_slowest_of_more_gpus_is_slower():
    v = Variability(compute_sigma=0.03)
    inflation = [expected_max(v, n) for n in (1024, 2048, 4096, 8192, 16384)]
    assert inflation == sorted(inflation) and inflation[0] > 1.08


def dp_only(gpus: int, variability: dict | None):
    return scenario(layers=4, micro_batches=4, dp=gpus,
                    cluster={"variability": variability} if variability else None)


def test_full_fidelity_waits_for_the_slowest_gpu_as_the_order_statistic_says():
    """DP only on free links: each draw of 64 GPUs slows the step by its largest factor, and
    over many seeds the mean slowdown is the expected maximum of 64 draws (within 5% of the
    inflation)."""
    gpus, sigma = 64, 0.05
    base = Engine(dp_only(gpus, None), "full", flat_profile()).run().step_time_s
    inflations = []
    for seed in range(60):
        spec = {"compute_sigma": sigma, "seed": seed}
        step = Engine(dp_only(gpus, spec), "full", flat_profile()).run().step_time_s
        assert step / base == pytest.approx(max(rank_factors(Variability(**spec), gpus)),
                                            rel=1e-6)
        inflations.append(step / base - 1)
    expected = expected_max(Variability(compute_sigma=sigma), gpus) - 1
    assert statistics.fmean(inflations) == pytest.approx(expected, rel=0.05)


def test_representative_and_closed_form_charge_the_expected_slowest():
    spec = {"compute_sigma": 0.04, "slow_fraction": 0.002, "slow_factor": 1.3}
    factor = expected_max(Variability(**spec), 512)
    for predict in (lambda s: Engine(s, profile=flat_profile()).run(),
                    lambda s: estimate(s, flat_profile())):
        plain, slow = predict(dp_only(512, None)), predict(dp_only(512, spec))
        assert slow.step_time_s / plain.step_time_s == pytest.approx(factor, rel=1e-6)


@pytest.mark.parametrize("spec, field", [
    ({"compute_sigma": -0.1}, "cluster.variability.compute_sigma"),
    ({"slow_fraction": 1.5}, "cluster.variability.slow_fraction"),
    ({"slow_factor": 0.5}, "cluster.variability.slow_factor"),
])
def test_bad_variability_names_its_field(spec, field):
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        dp_only(8, spec)


def test_the_stragglers_example_writes_its_plot_and_inflation_grows_with_the_job(tmp_path):
    """examples/stragglers.py (README): weak-scaled Llama 3 70B; a 2% spread costs more as the
    job grows, as the expected maximum of more draws does."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "stragglers.py"
    spec = importlib.util.spec_from_file_location("stragglers", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    table = example.inflation_table(sizes=(1024, 4096))
    spread = table["2% spread (sigma 0.02)"]
    assert 0 < spread[0] < spread[1]
    example.main(tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
