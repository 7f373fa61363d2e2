"""The engine's streams: compute and TP collectives as separate ops, NCCL slowing compute.

Oracles: with ``comm_compute_slowdown`` x, compute runs at ``1 - x`` of its speed while a
collective runs beside it, so a compute-bound step whose hidden traffic lasts D grows by x D;
``tp_comm_overlap`` exposes ``max(0, T - G)`` of T seconds of TP collectives beside G seconds of
GEMMs (x = 0).
"""

from __future__ import annotations

import pytest
from sim_helpers import scenario

from clustersim.simulator.closed_form import analytic as an
from clustersim.simulator.costs.cost_model import finalize_grads_time
from clustersim.simulator.costs.layer_comm import tensor_comm_total
from clustersim.simulator.costs.work import chunk_work
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.topologies import network as net
from clustersim.topologies.profile import Profile

SLOW_NODE = {"intra_node": {"bandwidth": 50, "latency": 1e-6}}  # GB/s: DP traffic takes time


def profile(slowdown: float, eff: float = 0.01) -> Profile:
    """Slow matmuls (eff) keep the step compute-bound; links at their line rate."""
    return Profile(name="x", gpu="any", matmul_efficiency=[[1e6, eff]], memory_efficiency=1.0,
                   comm_efficiency={"intra_node": 1.0, "inter_node": 1.0, "spine": 1.0},
                   comm_compute_slowdown=slowdown)


def dp_scenario():
    """One layer per 40M-parameter bucket (h = 2048): 4 buckets, the last backward reduces
    three of them behind the backward of the layers below."""
    return scenario(layers=4, micro_batches=2, dp=2, cluster=SLOW_NODE,
                    model={"hidden": 2048, "heads": 16})


def hidden_reduction(s) -> float:
    """All-reduce time of every bucket but the first layer's (reduced after the backward)."""
    cm = an.CostModel(s, profile(0.0))
    segments = chunk_work(cm)[0].segments
    assert len(segments) == 4
    return sum(net.allreduce_time(cm.dp, 4 * seg.dense_params) for seg in segments[1:])


@pytest.mark.parametrize("x", [0.1, 0.3])
def test_hidden_dp_traffic_slows_compute_by_x_times_its_duration(x):
    s = dp_scenario()
    base = simulate(s, profile=profile(0.0))
    slowed = simulate(s, profile=profile(x))
    hidden = hidden_reduction(s)
    assert hidden > 0.1 * base.step_time_s  # the effect under test is not noise
    assert slowed.step_time_s - base.step_time_s == pytest.approx(x * hidden, rel=1e-6)
    assert slowed.breakdown.compute - base.breakdown.compute == pytest.approx(x * hidden,
                                                                               rel=1e-6)
    # The closed form counts buckets as parameters / 40M (fractional), not whole layers: close.
    estimate_growth = an.estimate(s, profile(x)).step_time_s - an.estimate(
        s, profile(0.0)).step_time_s
    assert estimate_growth == pytest.approx(x * hidden, rel=0.1)


def test_zero_slowdown_changes_nothing():
    s = dp_scenario()
    plain = Profile(name="p", gpu="any", matmul_efficiency=[[1e6, 0.01]], memory_efficiency=1.0,
                    comm_efficiency={"intra_node": 1.0, "inter_node": 1.0, "spine": 1.0})
    assert simulate(s, profile=profile(0.0)) == simulate(s, profile=plain)


def tp_scenario(bandwidth: float):
    return scenario(layers=4, micro_batches=2, tp=2, sequence_parallel=True,
                    tp_comm_overlap=True, model={"hidden": 2048, "heads": 16},
                    cluster={"intra_node": {"bandwidth": bandwidth, "latency": 1e-6}})


@pytest.mark.parametrize("bandwidth", [2, 2000])  # GB/s: collectives outlast GEMMs / hide
def test_tp_overlap_exposes_what_outlasts_the_gemms(bandwidth):
    """Per pass, T of TP collectives beside G of GEMMs: exposed max(0, T - G); the engine's
    TP stream runs them concurrently with its compute stream, as the closed form says. In
    forward, the last of Transformer Engine's 4 pipelined splits of each reduce-scatter (half
    of T: two all-gathers and two reduce-scatters of one size) is sent after its GEMM:
    T/8 exposed whatever G. Once a step the norms' gradients are summed over the TP group,
    exposed (``finalize_grads_time``)."""
    s = tp_scenario(bandwidth)
    cm = an.CostModel(s, profile(0.0, eff=1.0))
    (g_fwd, g_bwd), _ = an.kernel_times(cm)
    t_fwd, t_bwd = tensor_comm_total(cm)
    tail = t_fwd / 2 / 4
    per_mb = 4 * (tail + max(0.0, t_fwd - tail - g_fwd) + max(0.0, t_bwd - g_bwd))
    r = simulate(s, profile=profile(0.0, eff=1.0))
    once = finalize_grads_time(cm, 0)
    assert once > 0
    assert r.breakdown.exposed_comm == pytest.approx(2 * per_mb + once, rel=1e-6, abs=1e-12)
    assert r.step_time_s == pytest.approx(an.estimate(s, profile(0.0, eff=1.0)).step_time_s,
                                            rel=1e-6)


@pytest.mark.parametrize("bandwidth, slower", [(2, False), (2000, True)])
def test_tp_overlap_with_slowdown_agrees_with_the_fluid_closed_form(bandwidth, slower):
    """With x, the pair ends at T where (1 - x) T >= G (collective-bound: no slower), else at
    G + x T (compute-bound: slower): engine = estimate."""
    s = tp_scenario(bandwidth)
    fast, slowed = profile(0.0, eff=1.0), profile(0.25, eff=1.0)
    engine = simulate(s, profile=slowed).step_time_s
    assert engine == pytest.approx(an.estimate(s, slowed).step_time_s, rel=1e-6)
    assert (engine > simulate(s, profile=fast).step_time_s) is slower


def test_compute_and_tp_streams_hold_separate_spans():
    """Under overlap the trace shows TP spans that start with the compute they overlap."""
    engine = Engine(tp_scenario(2), profile=profile(0.0, eff=1.0), record=True)
    engine.run()
    spans = engine.timeline.spans
    compute = [sp for sp in spans if sp.stream == "compute"]
    tp = [sp for sp in spans if sp.stream == "tp"]
    assert compute and tp
    assert any(abs(t.start - c.start) < 1e-15 and t.end > c.end for t in tp for c in compute)
