"""ZB-H2 (Qi et al. 2024, sec. 3.2): up to 2p - 1 micro-batches in flight per rank, built by
greedy list scheduling; its bubble and memory against the paper's closed forms."""

from __future__ import annotations

from collections import Counter

import pytest
import schedule_oracle as oracle
from sim_helpers import flat_profile, scenario

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.pipeline.greedy_schedules import zero_bubble_h2
from clustersim.simulator.pipeline.schedules import Action, Kind

F, I, W = Kind.FORWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_each_rank_runs_every_microbatch_forward_input_and_weight_once(pp, m):
    for r, actions in zero_bubble_h2(pp, m).items():
        assert Counter(actions) == Counter(
            [Action(r, k, i) for k in (F, I, W) for i in range(m)])
        for i in range(m):
            assert actions.index(Action(r, W, i)) > actions.index(Action(r, I, i))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m", [16, 32])
@pytest.mark.parametrize(("t_f", "t_i", "t_w"),
                         [(1, 1, 1), (1, 1.2, 0.8), (1, 1.5, 0.5), (1.2, 1, 1), (1, 0.8, 1.2)])
def test_bubble_is_p_minus_1_times_f_plus_b_minus_2w(pp, m, t_f, t_i, t_w):
    """Free sends: the first rank idles (p - 1)(T_F + T_B - 2 T_W) between its first pass and
    its last, none when that is negative (Qi et al. 2024, ZB-H2), and with equal passes no
    rank idles at all: the step is a parallelogram, each rank starting one forward later."""
    times = {F: t_f, I: t_i, W: t_w}
    ends, _ = oracle.finish_times(zero_bubble_h2(pp, m), pp, times)
    work = m * (t_f + t_i + t_w)
    assert ends[0] - work == pytest.approx(max(0.0, (pp - 1) * (t_f + t_i - 2 * t_w)))
    if t_f == t_i == t_w:
        for r in range(pp):
            assert ends[r] - r * t_f - work == pytest.approx(0.0)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_every_rank_holds_at_most_2p_minus_1(pp):
    """ZB-H2's memory: (2p - 1) M_B (the paper's), twice 1F1B's first stage less one; the
    memory model reads the same off the lists."""
    m = 4 * pp
    _, peak = oracle.execute(zero_bubble_h2(pp, m), pp, {F: 1, I: 1, W: 1})
    s = scenario(layers=pp, micro_batches=m, pp=pp, schedule="zb-h2")
    assert peak[0] == 2 * pp - 1
    for r in range(pp):
        assert peak[r] <= 2 * pp - 1
        assert mem.inflight_microbatches(s, r) == [peak[r]]


def test_engine_and_estimate_agree_and_the_bubble_beats_zbh1():
    profile = flat_profile()
    s = scenario(layers=16, micro_batches=16, pp=4, schedule="zb-h2")
    engine = Engine(s, profile=profile).run()
    assert engine.step_time_s == pytest.approx(estimate(s, profile).step_time_s, rel=0.03)
    h1 = Engine(scenario(layers=16, micro_batches=16, pp=4, schedule="zb-h1"),
                profile=profile).run()
    assert engine.breakdown.bubble < h1.breakdown.bubble
    assert engine.peak_bytes > h1.peak_bytes  # paid for with memory
