"""Each pipeline stage's breakdown and the stage and resource that set the step (issue 24,
item 6): a 2-stage pipeline whose second stage alone runs expert all-to-alls, checked against
the 1F1B closed form, and the per-rank arithmetic on hand-made totals.

Oracle for the pipeline (1F1B, pp 2, m micro-batches, stage 1 the slower, sends blocking, the
data-parallel reduction after the last backward): stage 1 starts when stage 0's first forward
``f0`` and its send ``S`` are done, then never waits, its last gradient send ends the stage-0
wait, and stage 0 runs its last backward ``b0``, reduces (``dp0``) and steps (``opt0``). So
stage 1's bubble (the step less its busy time) is ``f0 + S + b0 + (dp0 + opt0) - (dp1 +
opt1)``; its expert all-to-alls are ``m * layers * (dispatch + combine, forward and backward)``
each the pairwise closed form ``network.alltoall_time``.
"""

from __future__ import annotations

import pytest
from sim_helpers import FAST_HBM, flat_profile

from clustersim.simulator.closed_form.analytic import CostModel, estimate, optimizer_time
from clustersim.simulator.costs.stage_breakdown import bottleneck, from_totals
from clustersim.simulator.costs.token_dispatch import expert_alltoalls
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.discrete_event.steady import Totals
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import workload as wl
from clustersim.topologies import network as net

M = 8  # micro-batches
# Two dense first layers (stage 0: no all-to-all) and two MoE layers (stage 1).
MODEL = {"hidden": 512, "heads": 8, "ffn_hidden": 256, "vocab": 64, "seq_len": 256,
         "experts": 8, "top_k": 2, "capacity_factor": None, "ffn_kind": "swiglu",
         "layers": 4, "dense_layers": 2, "dense_ffn_hidden": 1024}


def two_stages():
    """Four GPUs in one node on a 5 GB/s, zero-latency fabric: the all-to-alls dominate."""
    return build_scenario({
        "model": MODEL,
        "cluster": {"preset": "dgx-h100", "gpus": 4, "gpu": FAST_HBM,
                    "intra_node": {"bandwidth": 5, "latency": 0.0}},
        "training": {"global_batch": 2 * M},
        "parallel": {"pp": 2, "dp": 2, "ep": 2, "schedule": "1f1b", "zero": 0,
                     "overlap_grad_reduce": False}})


def test_two_stage_pipeline_matches_the_closed_form():
    s, prof = two_stages(), flat_profile()
    engine = Engine(s, "representative", prof)
    r = engine.run()
    stage0, stage1 = r.stages
    cm = CostModel(s, prof)
    # Expert all-to-alls: stage 1's two MoE layers only, each the pairwise closed form, the
    # tokens' and the routing probabilities'.
    forward, backward = expert_alltoalls(cm)
    one = net.alltoall_time(cm.ep, wl.expert_dispatch_bytes(s))
    probs = net.alltoall_time(cm.ep, wl.expert_probs_bytes(s)) * (forward + backward) / 2
    assert stage1.comm["ep"] == pytest.approx(M * 2 * ((forward + backward) * one + probs),
                                              rel=1e-9)
    assert stage0.comm["ep"] == 0 and stage0.comm["tp"] == stage0.comm["cp"] == 0
    # Compute: m forwards and backwards of each stage's chunk.
    w0, w1 = engine.work
    assert stage0.compute == pytest.approx(M * (w0.forward + w0.backward), rel=1e-9)
    assert stage1.compute == pytest.approx(M * (w1.forward + w1.backward), rel=1e-9)
    # Each stage's parts sum to the step; the bubble is the step less the busy time.
    for b in r.stages:
        assert b.compute + b.exposed_comm + b.bubble + b.optimizer == pytest.approx(
            r.step_time_s, rel=1e-12)
        assert b.bubble == pytest.approx(r.step_time_s - b.busy, rel=1e-12)
    # Stage 1's bubble: the 1F1B fill and drain around it (module docstring). The DP
    # reductions come from the analytic estimator, a separate code path (closed forms).
    dp = [b.comm["dp"] for b in estimate(s, prof).stages]
    send = net.p2p_time(cm.pp, wl.pipeline_message_bytes(s))
    expected = (w0.forward + send + w0.backward + dp[0] + optimizer_time(cm, 0)
                - dp[1] - optimizer_time(cm, 1))
    assert stage1.bubble == pytest.approx(expected, rel=1e-6)
    assert stage0.comm["dp"] == pytest.approx(dp[0], rel=1e-9)
    # Stage 0 finishes last, so its entry is the step's breakdown_s (its own critical path).
    assert stage0.compute == pytest.approx(r.breakdown.compute, rel=1e-12)
    assert stage0.bubble == pytest.approx(r.breakdown.bubble, rel=1e-9)
    # ... but stage 1 sets the step, on its all-to-alls.
    critical = r.to_json()["bottleneck"]
    assert (critical["stage"], critical["resource"]) == (1, "ep")


def test_the_analytic_estimate_splits_the_same_way():
    s, prof = two_stages(), flat_profile()
    engine, analytic = Engine(s, "representative", prof).run(), estimate(s, prof)
    for e, a in zip(engine.stages, analytic.stages, strict=True):
        assert a.comm["ep"] == pytest.approx(e.comm["ep"], rel=1e-9)
        assert a.compute == pytest.approx(e.compute, rel=1e-9)
        assert a.busy + a.bubble == pytest.approx(analytic.step_time_s, rel=1e-12)
    # The closed form charges a stage both its sends and its receives (2 per micro-batch and
    # chunk); the engine's blocking sends charge a rank only what it sends.
    assert analytic.stages[0].comm["pp"] == pytest.approx(2 * engine.stages[0].comm["pp"])
    assert bottleneck(analytic.stages).stage == 1


def totals(finish, compute, bubble, optimizer, **comm):
    return Totals(finish, compute, sum(comm.values()), bubble, optimizer, 0.0, **comm)


def test_each_stage_is_its_busiest_rank_and_idles_until_the_step_ends():
    """Hand-made totals: two ranks of stage 0 (the busier one stands for it), one of stage 1
    that finished 2 s before the step's 10 s end: its bubble is its 1 s of waits plus those 2."""
    ranks = [totals(10.0, 4.0, 5.0, 0.5, tp=0.5), totals(10.0, 4.0, 4.0, 0.5, tp=1.5),
             totals(8.0, 3.0, 1.0, 0.5, ep=3.5)]
    stages = from_totals([0, 0, 1], ranks, 10.0)
    assert [(b.stage, b.compute, b.comm["tp"], b.bubble) for b in stages][0] == (0, 4.0, 1.5,
                                                                                 4.0)
    assert stages[1].bubble == pytest.approx(1.0 + 2.0)
    critical = bottleneck(stages)
    # Stage 1 is busier (7 s against 6 s) and its largest part is the all-to-all (3.5 s).
    assert (critical.stage, critical.resource, critical.seconds) == (1, "ep", 3.5)
    assert critical.busy == pytest.approx(7.0)


def test_compute_bound_stage_says_compute_and_names_its_largest_overhead():
    stages = from_totals([0], [totals(5.0, 4.0, 0.0, 0.25, dp=0.75)], 5.0)
    critical = bottleneck(stages)
    assert (critical.resource, critical.overhead, critical.overhead_seconds) == (
        "compute", "dp", 0.75)
    assert "compute" in critical.sentence() and "dp" in critical.sentence()
