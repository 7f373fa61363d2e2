"""Error bars: step times predicted under profiles drawn from their stated uncertainty."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from sim_helpers import scenario

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.planning.spread import spread
from clustersim.topologies.profile import Profile, profile_for_gpu
from clustersim.topologies.uncertainty import sampled_profile

Z95 = 1.6448536269514722  # the standard normal's 95th percentile


def compute_bound(sigma: float) -> tuple:
    """One GPU, no communication; the shipped H100 GEMM model with only its ceiling unsure
    (and no fixed once-a-step host time, which would not scale with it)."""
    base = profile_for_gpu("h100-sxm").model_copy(
        update={"uncertainty": {"gemm.ceiling": sigma} if sigma else {}, "step_overhead_s": 0.0})
    s = scenario(layers=8, micro_batches=8, model={"hidden": 4096, "heads": 32, "seq_len": 4096,
                                                   "vocab": 32000})
    return s, base


def test_without_uncertainty_the_interval_collapses_to_the_point_estimate():
    s, base = compute_bound(0.0)
    result = spread(lambda p: estimate(s, p), base, samples=25, seed=3)
    point = estimate(s, base).step_time_s
    assert result.step_time_s == pytest.approx((point, point, point), rel=1e-12)


def test_a_known_spread_gives_the_hand_computed_interval():
    """The step is monotone in the ceiling, so its 5th/95th percentiles are the step at the
    ceiling's 95th/5th: ceiling * exp(+-1.645 sigma). Compute-bound, the step scales as
    1/ceiling, so the interval's ends are about exp(+-1.645 sigma) times the point."""
    sigma = 0.05
    s, base = compute_bound(sigma)
    result = spread(lambda p: estimate(s, p), base, samples=800, seed=1)

    def at(z: float) -> float:
        gemm = base.gemm.model_copy(update={"ceiling": base.gemm.ceiling * math.exp(sigma * z)})
        return estimate(s, base.model_copy(update={"gemm": gemm})).step_time_s

    lo, median, hi = result.step_time_s
    assert lo == pytest.approx(at(+Z95), rel=0.01)
    assert hi == pytest.approx(at(-Z95), rel=0.01)
    assert median == pytest.approx(at(0.0), rel=0.005)
    point = at(0.0)
    assert hi / point == pytest.approx(math.exp(Z95 * sigma), rel=0.02)


def test_the_same_seed_gives_the_same_interval():
    s, base = compute_bound(0.05)
    one = spread(lambda p: estimate(s, p), base, samples=30, seed=7)
    two = spread(lambda p: estimate(s, p), base, samples=30, seed=7)
    other = spread(lambda p: estimate(s, p), base, samples=30, seed=8)
    assert one == two and one != other


def test_draws_are_lognormal_around_the_stated_figure_and_capped_at_one():
    shipped = profile_for_gpu("a100-80gb")
    base = shipped.model_copy(update={
        "comm_efficiency": {**shipped.comm_efficiency, "spine": 0.5},  # 1.0 is 7 sigma away
        "uncertainty": {"comm_efficiency.spine": 0.1, "memory_efficiency": 2.0}})
    rng = random.Random(0)
    draws = [sampled_profile(base, rng) for _ in range(2000)]
    logs = [math.log(d.comm_eff("spine") / 0.5) for d in draws]
    assert statistics.median(logs) == pytest.approx(0.0, abs=0.01)
    assert statistics.pstdev(logs) == pytest.approx(0.1, rel=0.1)
    assert max(d.memory_efficiency for d in draws) == 1.0  # capped: an efficiency


def test_a_spread_on_attention_moves_every_kernel_familys_figures_alike():
    # H100 runs Megatron-Core's attention as the flash3 family (attention_by_kernel): a draw
    # of attention_efficiency must reach it, forward and backward, by the same factor.
    shipped = profile_for_gpu("h100-sxm")
    base = shipped.model_copy(update={"uncertainty": {"attention_efficiency": 0.05}})
    for draw in (sampled_profile(base, random.Random(seed)) for seed in range(5)):
        factor = draw.attention_efficiency / shipped.attention_efficiency
        assert factor != pytest.approx(1.0)
        for family in ("flash2", "flash3"):
            forward, backward = draw.attention_fractions(family)
            assert forward == pytest.approx(shipped.attention_fractions(family)[0] * factor)
            assert backward == pytest.approx(shipped.attention_fractions(family)[1] * factor)


@pytest.mark.parametrize("table, message", [
    ({"gemm.ceiling": -0.1}, "greater than 0"),
    ({"flops": 0.1}, "unknown parameter 'flops'"),
])
def test_a_bad_uncertainty_is_refused(table, message):
    with pytest.raises(ValueError, match=message):
        Profile.model_validate({**profile_for_gpu("h100-sxm").model_dump(), "uncertainty": table})


def test_simulate_samples_prints_the_interval_and_the_json_carries_it(capsys):
    assert main(["simulate", "examples/llama3-70b-h100.yaml", "--samples", "8", "--json",
                 "--fidelity", "analytic"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    lo, hi = out["step_time_interval_s"]
    assert lo < out["step_time_median_s"] < hi and out["samples"] == 8
    assert out["time_to_train_interval_s"][0] < out["time_to_train_interval_s"][1]
    assert main(["simulate", "examples/llama3-70b-h100.yaml", "--json"]) == 0
    assert "step_time_interval_s" not in json.loads(capsys.readouterr().out)  # not asked


def test_fewer_than_two_samples_is_one_error_line(capsys):
    assert main(["simulate", "examples/llama3-70b-h100.yaml", "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: samples:") and err.count("\n") == 1


def test_the_python_api_takes_samples():
    import clustersim
    sim = clustersim.simulate("examples/llama3-70b-h100.yaml", fidelity="analytic", samples=5)
    assert sim.to_dict()["samples"] == 5
    with pytest.raises(ScenarioError):
        clustersim.simulate("examples/llama3-70b-h100.yaml", samples=0)


def test_sweep_samples_give_every_point_an_interval(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(["sweep", "examples/llama3-70b-h100.yaml", "--grid", "parallel.tp=4,8",
                 "--fidelity", "analytic", "--samples", "6", "--out", str(out), "--jobs", "1"]) == 0
    import pandas as pd
    table = pd.read_csv(out)
    assert (table["step_time_lo_s"] < table["step_time_median_s"]).all()
    assert (table["step_time_median_s"] < table["step_time_hi_s"]).all()
    assert "90% interval s" in capsys.readouterr().out


def test_plan_samples_put_error_bars_on_each_plan():
    import clustersim
    found = clustersim.plan("llama3-8b", "dgx-h100", 16, top=2, samples=4, seed=2)
    for entry in found.to_list():
        lo, hi = entry["plan"]["step_time_interval_s"]
        assert lo < entry["plan"]["step_time_median_s"] < hi and entry["plan"]["samples"] == 4


@pytest.mark.parametrize("command", [
    ["sweep", "examples/llama3-70b-h100.yaml", "--grid", "parallel.tp=4,8"],
    ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16"],
])
def test_one_sample_is_one_error_line(capsys, command):
    assert main([*command, "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --samples:") and err.count("\n") == 1


@pytest.mark.parametrize(("uncertainty", "warned"), [
    ({"comm_efficiency.inter_node": 0.05}, True),  # compute fixed: the interval is links alone
    ({"gemm.ceiling": 0.05}, False)])
def test_an_interval_that_leaves_compute_fixed_says_it_is_not_the_models_error(uncertainty,
                                                                                warned):
    from clustersim.cli.simulate import spread_line
    s, base = compute_bound(0.0)
    drawn = base.model_copy(update={"uncertainty": uncertainty})
    line = spread_line(spread(lambda p: estimate(s, p), drawn, samples=5, seed=0))
    assert ("not the model's error" in line) == warned
