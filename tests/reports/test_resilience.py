"""Checkpoint intervals against Young's first-order optimum and Daly's expected wall time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.reports import resilience as rs


@given(delta=st.floats(1.0, 600.0), mtbf=st.floats(3600.0, 1e7))
def test_daly_interval_minimises_the_expected_wall_time(delta, mtbf):
    """Daly's closed form sits at the minimum of his own wall-time model (scanned to 0.1%)."""
    tau = rs.daly_interval(delta, mtbf)
    wall = rs.expected_wall_time(1e7, tau, delta, 300.0, mtbf)
    scan = min(rs.expected_wall_time(1e7, tau * f, delta, 300.0, mtbf)
               for f in [0.5 + 0.001 * i for i in range(1001)])
    assert wall <= scan * 1.001


@given(delta=st.floats(1.0, 100.0))
def test_young_is_the_limit_of_rare_checkpoints_against_rare_failures(delta):
    mtbf = 1e9
    assert rs.daly_interval(delta, mtbf) == pytest.approx(rs.young_interval(delta, mtbf),
                                                          rel=1e-3)


def test_without_failures_only_the_checkpoint_writes_cost_time():
    """M -> infinity: wall = T_s (1 + delta / tau)."""
    wall = rs.expected_wall_time(1e6, 3600.0, 60.0, 300.0, 1e15)
    assert wall == pytest.approx(1e6 * (1 + 60 / 3600), rel=1e-6)


def test_system_mtbf_falls_with_the_gpu_count_and_goodput_with_it():
    small = rs.checkpoint_plan(1e7, 1024, 50_000, 60.0, 300.0)
    large = rs.checkpoint_plan(1e7, 16384, 50_000, 60.0, 300.0)
    assert small.system_mtbf_s == pytest.approx(50_000 * 3600 / 1024)
    assert large.interval_s == pytest.approx(small.interval_s / 4, rel=0.05)  # sqrt(16)
    assert 0 < large.goodput < small.goodput < 1
    assert small.expected_wall_time_s == pytest.approx(1e7 / small.goodput)


def test_checkpoints_longer_than_twice_the_mtbf_use_the_mtbf():
    assert rs.daly_interval(1000.0, 400.0) == 400.0
    assert math.isfinite(rs.expected_wall_time(1e5, 400.0, 1000.0, 10.0, 400.0))
