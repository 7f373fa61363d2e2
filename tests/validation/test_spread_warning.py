"""validate warns when its timed steps disagree (a busy machine) and says how to get a quiet
measurement; steps that agree get no warning."""

from __future__ import annotations

from clustersim.validation.noise import spread_warning


def test_the_observed_spread_of_4_7_s_on_13_s_is_warned_with_the_remedy():
    warning = spread_warning({"step_time_s": 13.0, "step_time_spread_s": 9.4}, steps=6)
    assert warning.startswith("warning: step times varied by ±4.70 s on 13.00 s (36%)")
    assert "--steps 12" in warning and "stop other work" in warning


def test_steps_within_ten_percent_are_not_warned():
    assert spread_warning({"step_time_s": 13.0, "step_time_spread_s": 2.6}, steps=6) is None
    assert spread_warning({"step_time_s": 13.0, "step_time_spread_s": 2.7}, steps=6)
