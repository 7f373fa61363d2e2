"""Fluid links: concurrent flows share bandwidth equally, re-rated on arrivals and departures."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from clustersim.simulator.links import FluidLink


@pytest.fixture
def env() -> simpy.Environment:
    return simpy.Environment()


def finish_times(env, link, starts_and_sizes) -> list[float]:
    finished: dict[int, float] = {}

    def flow(i, start, size):
        yield env.timeout(start)
        yield link.transfer(size)
        finished[i] = env.now

    for i, (start, size) in enumerate(starts_and_sizes):
        env.process(flow(i, start, size))
    env.run()
    return [finished[i] for i in range(len(starts_and_sizes))]


def test_one_flow_takes_latency_plus_size_over_bandwidth(env):
    link = FluidLink(env, bandwidth=100.0, latency=0.5)
    assert finish_times(env, link, [(0, 250)]) == [pytest.approx(3.0)]


def test_two_equal_flows_each_get_half_the_bandwidth(env):
    link = FluidLink(env, bandwidth=10.0)
    assert finish_times(env, link, [(0, 50), (0, 50)]) == [pytest.approx(10.0)] * 2


def test_staggered_flows_follow_processor_sharing(env):
    """Three 50 B flows on 10 B/s starting at 0, 2, 4 end at 10, 14, 15 (NOTES.md B8):
    alone 0-2 (20 B), two flows 2-4 (10 B each), three flows until the first finishes ..."""
    link = FluidLink(env, bandwidth=10.0)
    assert finish_times(env, link, [(0, 50), (2, 50), (4, 50)]) == [
        pytest.approx(10.0), pytest.approx(14.0), pytest.approx(15.0)]


@given(sizes=st.lists(st.floats(1, 1e6), min_size=1, max_size=8),
       bandwidth=st.floats(1, 1e3))
def test_simultaneous_flows_finish_in_size_order_and_the_link_stays_busy(sizes, bandwidth):
    """Work conservation: the last flow ends when all bytes have crossed at full bandwidth."""
    env = simpy.Environment()
    link = FluidLink(env, bandwidth)
    ends = finish_times(env, link, [(0, s) for s in sizes])
    assert max(ends) == pytest.approx(sum(sizes) / bandwidth, rel=1e-9)
    by_size = [e for _, e in sorted(zip(sizes, ends, strict=True))]
    assert by_size == sorted(by_size)
