"""The one description of data-parallel traffic (``costs/dp_reduction.py``) both estimators read.

Oracles: the ZeRO paper's collectives (Rajbhandari et al. 2020, sec. 5: DDP all-reduces the
gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated parameters; ZeRO-3 gathers
each unit's parameters before use), Megatron-LM's fp32 main gradients under bf16 (4 bytes a
parameter reduced, 2 gathered), DeepSpeed's stage-2 epilogue (every micro-batch, not under a
pipeline), FSDP's prefetch order (the next unit's gather issued before the current one runs),
and the engine's own trace for the order it issues them in.
"""

from __future__ import annotations

import pytest
from sim_helpers import flat_profile, scenario

from clustersim.simulator.costs import dp_reduction as dp
from clustersim.simulator.discrete_event.engine import Engine

ANY_SIZE = {"dp": 8, "edp": 2}.get  # a dense group of 8 replicas, an expert group of 2
PARAMS = 1_000_000


@pytest.mark.parametrize(("zero", "op"), [(0, "allreduce"), (1, "reduce_scatter"),
                                          (2, "reduce_scatter"), (3, "reduce_scatter")])
def test_a_reduction_is_an_allreduce_under_ddp_and_a_reduce_scatter_under_zero(zero, op):
    s = scenario(dp=8, zero=zero)
    assert dp.reduction(s, PARAMS, 0, ANY_SIZE) == [dp.DpCollective("dp", op, 4 * PARAMS)]


def test_gradients_reduce_in_grad_dtype_and_weights_gather_in_the_training_precision():
    """Megatron-LM under bf16: fp32 main gradients (4 bytes), bf16 weights (2 bytes)."""
    s = scenario(dp=8, zero=1)
    assert dp.reduction(s, PARAMS, 0, ANY_SIZE)[0].nbytes == 4 * PARAMS
    assert dp.gather(s, PARAMS, 0, ANY_SIZE) == [dp.DpCollective("dp", "allgather", 2 * PARAMS)]
    bf16 = scenario(dp=8, zero=1, training={"grad_dtype": "bf16"})
    assert dp.reduction(bf16, PARAMS, 0, ANY_SIZE)[0].nbytes == 2 * PARAMS


def test_ddp_gathers_nothing_and_one_rank_groups_reduce_nothing():
    assert dp.gather(scenario(dp=8, zero=0), PARAMS, PARAMS, ANY_SIZE) == []
    alone = {"dp": 1, "edp": 1}.get
    assert dp.reduction(scenario(dp=8, zero=1), PARAMS, PARAMS, alone) == []


def test_dense_parameters_reduce_over_dp_then_experts_over_edp():
    s = scenario(dp=8, zero=0)
    assert dp.reduction(s, PARAMS, 3 * PARAMS, ANY_SIZE) == [
        dp.DpCollective("dp", "allreduce", 4 * PARAMS),
        dp.DpCollective("edp", "allreduce", 12 * PARAMS)]
    assert [c.group for c in dp.reduction(s, 0, PARAMS, ANY_SIZE)] == ["edp"]


@pytest.mark.parametrize(("zero", "pp", "overlap", "expected"), [
    (0, 1, True, dp.DpTiming(dp.PER_STEP, True, dp.NONE, 0)),
    (1, 1, True, dp.DpTiming(dp.PER_STEP, True, dp.BEFORE_STEP, 0)),
    (1, 1, False, dp.DpTiming(dp.PER_STEP, False, dp.AFTER_STEP, 0)),
    (2, 1, True, dp.DpTiming(dp.PER_MICROBATCH, True, dp.BEFORE_STEP, 0)),
    (2, 2, True, dp.DpTiming(dp.PER_STEP, True, dp.BEFORE_STEP, 0)),  # no stage 2 under a pipeline
    (3, 1, True, dp.DpTiming(dp.PER_UNIT, True, dp.PER_UNIT, 1)),
    (3, 1, False, dp.DpTiming(dp.PER_UNIT, True, dp.PER_UNIT, 0)),
])
def test_when_reductions_and_gathers_run(zero, pp, overlap, expected):
    s = scenario(layers=8, dp=2, pp=pp, zero=zero, overlap_grad_reduce=overlap,
                 overlap_param_gather=overlap)
    assert dp.dp_timing(s.parallel) == expected


@pytest.mark.parametrize(("zero", "pp", "expected"), [
    (0, 1, (1, 0)), (1, 1, (1, 1)), (2, 1, (8, 1)), (2, 2, (1, 1)), (3, 1, (8, 16))])
def test_how_often_a_step_of_8_microbatches_reduces_and_gathers_each_parameter(zero, pp,
                                                                               expected):
    """DDP and ZeRO-1 reduce once a step; ZeRO-2 every micro-batch (once under a pipeline);
    ZeRO-3 reduces every micro-batch and gathers before each forward and each backward."""
    s = scenario(layers=8, micro_batches=8, dp=2, pp=pp, zero=zero)
    assert dp.per_step(dp.dp_timing(s.parallel), s.microbatches) == expected


def test_prefetch_issues_the_next_units_before_the_running_one():
    """Depth 1, four units: unit 0 issues its own gather and unit 1's, then each unit the
    next one's (FSDP forward_prefetch); depth 0 issues each when due."""
    issued: set[int] = set()
    order = []
    for k in range(4):
        due = dp.gathers_due(k, 4, 1, issued)
        issued.update(due)
        order.append(due)
    assert order == [[0, 1], [2], [3], []]
    assert [dp.gathers_due(k, 4, 0, set(range(k))) for k in range(4)] == [[0], [1], [2], [3]]


def test_the_engine_issues_zero3_collectives_in_the_described_order():
    """One micro-batch of four layers (one unit each) under ZeRO-3 with prefetch 1: the DP
    stream's spans in the engine's trace follow ``gathers_due`` forward, then backward in
    reverse with each unit's reduce-scatter after its backward."""
    s = scenario(layers=4, micro_batches=1, dp=2, zero=3)
    engine = Engine(s, profile=flat_profile(), record=True)
    engine.run()
    names = [span.name for span in sorted(engine.timeline.spans, key=lambda x: x.start)
             if span.stream == "dp"]
    units = len(engine.work[0].segments)
    assert units == 4
    forward = [f"AG 0.{k}" for k in range(4)]
    backward = ["AG 0.3", "AG 0.2", "RS 0.3", "AG 0.1", "RS 0.2", "AG 0.0", "RS 0.1", "RS 0.0"]
    assert names == forward + backward


def test_every_dualpipe_stage_pays_its_gradient_swap_in_the_closed_form_as_in_the_engine(
        monkeypatch):
    """Each rank swaps its stages' gradients with its twin after the reduction, the last rank
    (whose twin is rank 0) too: on 10 GB/s links with no latency each stage's once-a-step
    time grows by its gradient bytes / 10 GB/s (hand computation from the parameter count)."""
    from clustersim.simulator.closed_form import analytic
    from clustersim.simulator.costs import memory as mem
    from clustersim.simulator.costs.stage_costs import StageCosts

    slow = {"bandwidth": 10, "latency": 0.0}
    s = scenario(layers=16, micro_batches=16, pp=4, schedule="dualpipe", virtual_stages=2,
                 cluster={"intra_node": slow, "inter_node": slow})
    costs = StageCosts(s, flat_profile())
    swapped = [analytic.stage_times(costs.stage(i), i).grad_sync for i in range(4)]
    monkeypatch.setattr(analytic, "twin_stage", lambda s, stage: None)
    apart = [analytic.stage_times(costs.stage(i), i).grad_sync for i in range(4)]
    grads = [sum(mem.stage_params_per_rank(s, i)) * 4 / 10e9 for i in range(4)]  # fp32
    assert [a - b for a, b in zip(swapped, apart, strict=True)] == pytest.approx(grads, rel=1e-9)


TIED = {"vocab": 32000, "hidden": 512}


@pytest.mark.parametrize(("model", "parallel", "expected"), [
    (TIED, {"pp": 4}, [1, 0, 0, 1]),  # the first and the last stage, nothing between
    (TIED, {"pp": 4, "schedule": "interleaved", "virtual_stages": 2}, [1, 0, 0, 1]),
    (TIED, {"pp": 4, "schedule": "zb-v", "virtual_stages": 2}, [0, 0, 0, 0]),  # both on stage 0
    ({**TIED, "tie_embeddings": False}, {"pp": 4}, [0, 0, 0, 0]),
    (TIED, {"pp": 1}, [0]),
])
def test_a_tied_embeddings_gradient_is_summed_where_its_two_copies_sit_apart(model, parallel,
                                                                             expected):
    """Megatron-LM's embedding group all-reduces the whole word-embedding gradient, V h / t in
    the gradient dtype (fp32 under bf16), between the stage of the input embedding and that of
    the output layer, whatever the ZeRO stage."""
    from clustersim.simulator.costs.cost_model import embedding_sync_bytes
    s = scenario(layers=8, micro_batches=8, tp=2, zero=1, dp=2, model=model, **parallel)
    table = 32000 * 512 / 2 * 4
    assert [embedding_sync_bytes(s, i) for i in range(len(expected))] == [
        e * table for e in expected]


def test_the_end_stages_wait_for_the_tied_embeddings_gradient_sum_in_both_estimators(
        monkeypatch):
    """On 10 GB/s links with no latency the sum takes V h / t x 4 bytes / 10 GB/s (the two
    ranks exchange the whole gradient both ways at once): the closed form adds it to the end
    stages' once-a-step traffic, and the engine's step, which the first stage ends, grows by it,
    charged to that stage's exposed data-parallel communication."""
    from clustersim.simulator.closed_form import analytic
    from clustersim.simulator.costs.stage_costs import StageCosts
    from clustersim.simulator.discrete_event import dp_traffic, walk_rank

    slow = {"bandwidth": 10, "latency": 0.0}
    s = scenario(layers=8, micro_batches=8, pp=4, model=TIED,
                 cluster={"intra_node": slow, "inter_node": slow})
    seconds = 32000 * 512 * 4 / 10e9
    costs = StageCosts(s, flat_profile())
    summed = [analytic.stage_times(costs.stage(i), i).grad_sync for i in range(4)]
    engine = Engine(s, profile=flat_profile()).run()
    for module in (analytic, dp_traffic, walk_rank):
        monkeypatch.setattr(module, "finalize_grads_time", lambda cm, stage: 0.0)
    apart = [analytic.stage_times(costs.stage(i), i).grad_sync for i in range(4)]
    assert [a - b for a, b in zip(summed, apart, strict=True)] == pytest.approx(
        [seconds, 0, 0, seconds], rel=1e-9)
    without = Engine(s, profile=flat_profile()).run()
    assert engine.step_time_s - without.step_time_s == pytest.approx(seconds, rel=1e-9)
    assert engine.stages[0].comm["dp"] - without.stages[0].comm["dp"] == pytest.approx(
        seconds, rel=1e-9)
