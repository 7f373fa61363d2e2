"""ZeRO-3: per-unit gathers and reduce-scatters, prefetch depth, engine and analytic agreeing.

Oracles: the alpha-beta ring formulas written out here, FSDP's schedule in closed form (no
prefetch exposes every collective; with prefetch a pass exposes its first gather and then
``max(0, gather - compute)`` per unit), and the engine itself for the analytic estimate.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_helpers import flat_profile, no_slowdown, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import CostModel, estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import zero3
from clustersim.simulator.costs.work import chunk_work
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

# The scenarios on which the engine and the analytic estimate must agree (README, ZeRO-3).
AGREEMENT = {
    "llama2-7b, 512 H100, dp only": ("llama2-7b", 64, {}),
    "llama3-8b, 64 H100, dp only, full recompute": ("llama3-8b", 8, {"recompute": "full"}),
    "llama3-70b, 512 H100, tp 8 dp 64, full recompute":
        ("llama3-70b", 64, {"tp": 8, "sequence_parallel": True, "recompute": "full"}),
    "llama3-70b, 512 H100, tp 8 pp 4 dp 16, full recompute":
        ("llama3-70b", 64, {"tp": 8, "pp": 4, "sequence_parallel": True, "recompute": "full"}),
    "llama2-7b, 4096 H100, pp 4 dp 1024": ("llama2-7b", 512, {"pp": 4}),
}
LINE_RATE = flat_profile(0.5)  # links at their line rate, matmuls at half of peak


def h100_zero3(model: str, nodes: int, per_replica: int = 4, **parallel):
    """``model`` on ``nodes`` DGX H100 nodes under ZeRO-3, ``per_replica`` sequences per
    data-parallel replica (a fixed per-GPU batch as the cluster grows)."""
    p = {"zero": 3, **parallel}
    replicas = nodes * 8 // (p.get("tp", 1) * p.get("pp", 1))
    return build_scenario({
        "model": {"preset": model},
        "cluster": {"preset": "dgx-h100", "nodes": nodes},
        "training": {"global_batch": per_replica * replicas, "micro_batch": 1},
        "parallel": p,
    })


def one_node_zero3(**parallel):
    """8 layers on one 8-GPU node, dp 8, links with a round bandwidth and latency."""
    link = {"bandwidth": 100.0, "latency": 1e-5}
    return scenario(layers=8, micro_batches=3, dp=8, zero=3, model={"hidden": 1024},
                    cluster={"intra_node": link, "inter_node": link}, **parallel)


def ring(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather (or reduce-scatter) of an ``nbytes`` buffer over ``n`` ranks."""
    return (n - 1) / n * nbytes / bandwidth + (n - 1) * latency


@pytest.mark.parametrize("case", AGREEMENT)
def test_engine_and_analytic_agree_within_five_percent(case):
    model, nodes, parallel = AGREEMENT[case]
    s = h100_zero3(model, nodes, **parallel)
    profile = no_slowdown("h100-sxm")  # the two model the slowdown apart (README: accuracy)
    engine, analytic = simulate(s, profile=profile), estimate(s, profile)
    print(f"\n{case}: engine {engine.step_time_s:.3f} s, analytic {analytic.step_time_s:.3f} s")
    assert analytic.step_time_s == pytest.approx(engine.step_time_s, rel=0.05)
    if s.parallel.pp == 1:  # passes back to back: the recurrence is the engine's timeline
        assert analytic.breakdown.exposed_comm == pytest.approx(engine.breakdown.exposed_comm,
                                                                rel=0.01)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_full_fidelity_runs_zero3_like_the_representative_engine(recompute):
    s = h100_zero3("llama3-8b", 2, per_replica=2, recompute=recompute)
    full, representative = simulate(s, "full"), simulate(s)
    assert full.step_time_s == pytest.approx(representative.step_time_s, rel=0.05)
    assert full.step_time_s == pytest.approx(estimate(s).step_time_s, rel=0.05)


def test_without_prefetch_every_gather_and_reduce_scatter_is_exposed():
    """Each unit's gather waits until its turn, in the backward behind the previous unit's
    reduce-scatter: per micro-batch ``U (2 g + r)`` on the ring formulas, nothing hidden."""
    s = one_node_zero3(overlap_param_gather=False)
    units = [mem.layer_params_per_rank(s.model, 1, 1)[0]] * s.model.layers
    units[0] += mem.embedding_params_per_rank(s.model, 1)  # tokens and learned positions
    units[-1] += mem.head_params_per_rank(s.model, 1, False)
    # bf16 weights gathered twice, fp32 gradients reduce-scattered once
    expected = s.microbatches * sum(2 * ring(p * 2, 8, 100e9, 1e-5) + ring(p * 4, 8, 100e9, 1e-5)
                                    for p in units)
    assert simulate(s, profile=LINE_RATE).breakdown.exposed_comm == pytest.approx(expected,
                                                                                  rel=2e-3)
    assert estimate(s, LINE_RATE).breakdown.exposed_comm == pytest.approx(expected, rel=2e-3)


def test_full_recompute_gathers_once_per_backward():
    """The recomputed forward runs inside the unit's backward, under the same gather: without
    prefetch the exposed traffic is the same with and without recomputation."""
    plain = simulate(one_node_zero3(overlap_param_gather=False), profile=LINE_RATE)
    recompute = simulate(one_node_zero3(overlap_param_gather=False, recompute="full"),
                         profile=LINE_RATE)
    assert recompute.breakdown.compute > plain.breakdown.compute
    assert recompute.breakdown.exposed_comm == pytest.approx(plain.breakdown.exposed_comm)


def test_overlap_param_gather_off_means_no_prefetch():
    off = simulate(one_node_zero3(overlap_param_gather=False)).step_time_s
    assert simulate(one_node_zero3(zero3_prefetch=0)).step_time_s == pytest.approx(off)
    assert simulate(one_node_zero3()).step_time_s < off


def test_prefetch_hides_gathers_behind_compute_but_not_the_first_of_a_pass():
    """With compute longer than the traffic, a pass exposes only its first unit's gather, and
    a backward also its last reduce-scatter."""
    link = {"bandwidth": 1000.0, "latency": 1e-6}
    s = scenario(layers=8, micro_batches=3, dp=8, zero=3, model={"hidden": 1024},
                 cluster={"intra_node": link, "inter_node": link},
                 training={"micro_batch": 8, "global_batch": 3 * 8 * 8})
    cm = CostModel(s, LINE_RATE)
    forward, backward, _ = cm.per_layer
    params = mem.layer_params_per_rank(s.model, 1, 1)[0]
    gather, reduce = ring(params * 2, 8, 1000e9, 1e-6), ring(params * 4, 8, 1000e9, 1e-6)
    assert gather < forward and gather + reduce < backward  # compute-bound units
    # Per micro-batch: the first gather of the forward and of the backward, and the last
    # reduce-scatter of the backward, which nothing follows (FSDP's end-of-backward callback
    # waits for it; here the next forward's first gather queues behind it).
    # The first unit also holds the embeddings, the last the output layer.
    first = params + mem.embedding_params_per_rank(s.model, 1)
    last = params + mem.head_params_per_rank(s.model, 1, False)
    expected = s.microbatches * (ring(first * 2, 8, 1000e9, 1e-6) + ring(last * 2, 8, 1000e9, 1e-6)
                                 + ring(first * 4, 8, 1000e9, 1e-6))
    assert simulate(s, profile=LINE_RATE).breakdown.exposed_comm == pytest.approx(expected,
                                                                                  rel=0.01)


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=12))
def test_forward_pass_exposes_first_gather_plus_shortfalls(units):
    """FSDP's forward with one unit prefetched: ``g_0 + sum_k max(0, g_(k+1) - c_k)``."""
    times = [zero3.UnitTimes(g, c) for g, c in units]
    expected = units[0][0] + sum(max(0.0, units[k + 1][0] - units[k][1])
                                 for k in range(len(units) - 1))
    result = zero3.run_pass(times, depth=1)
    assert result.exposed == pytest.approx(expected, abs=1e-9)
    assert result.busy == pytest.approx(expected + sum(c for _, c in units), abs=1e-9)


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)), min_size=1,
                max_size=12), st.integers(0, 4))
def test_a_deeper_prefetch_never_exposes_more(units, depth):
    times = [zero3.UnitTimes(*u) for u in units]
    assert (zero3.run_pass(times, depth + 1).busy
            <= zero3.run_pass(times, depth).busy + 1e-9)


def test_large_dp_groups_without_model_parallelism_scale_poorly():
    """llama2-7b dp-only at 4 sequences per GPU, 64 to 4,096 H100s: the layer's gather grows
    with the ring's inter-node steps (latency) until it outlasts the layer's forward; from
    there every unit exposes the difference and per-GPU throughput falls."""
    sizes = [8, 64, 512]  # nodes: 64, 512, 4096 GPUs
    results = [simulate(h100_zero3("llama2-7b", n)) for n in sizes]
    per_gpu = [r.tokens_per_s / r.gpus for r in results]
    exposed = [r.breakdown.exposed_comm / r.step_time_s for r in results]
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]
    assert exposed[0] < exposed[1] < exposed[2]
    assert per_gpu[2] < 0.85 * per_gpu[0]
    # Where it happens: the dp size past which a layer's gather outlasts its forward.
    s = h100_zero3("llama2-7b", 512)
    cm = CostModel(s)
    forward, _, _ = cm.per_layer
    layer = mem.layer_params_per_rank(s.model, 1, 1)[0]
    limit = zero3.hidden_gather_limit(cm, layer, forward, [64, 512, 1024, 2048, 4096])
    assert limit is not None and 512 <= limit < 4096


def test_hybrid_sharding_keeps_a_large_group_s_gathers_in_the_node():
    """docs/modelling.md: llama2-7b on 4,096 H100 under ZeRO-3 gathers over 4,096 ranks and
    runs at 3.7k tokens/s per GPU; one sharded copy per node (dp_shard 8) gathers over NVLink
    and runs near the 512-GPU rate, for the states of 8 ranks instead of 4,096."""
    plain, hybrid = (simulate(h100_zero3("llama2-7b", 512, **p)) for p in ({}, {"dp_shard": 8}))
    per_gpu = [r.tokens_per_s / r.gpus for r in
               (simulate(h100_zero3("llama2-7b", n)) for n in (8, 64))]
    per_gpu += [plain.tokens_per_s / plain.gpus, hybrid.tokens_per_s / hybrid.gpus]
    assert per_gpu == pytest.approx([10.0e3, 9.6e3, 3.7e3, 9.4e3], rel=0.01)
    assert (plain.peak_bytes / 2**30, hybrid.peak_bytes / 2**30) == pytest.approx((18.4, 32.5),
                                                                                 abs=0.05)


@pytest.mark.parametrize("nodes", [8, 512])
def test_steady_state_is_the_slower_of_compute_and_dp_stream_per_unit(nodes):
    """Each unit costs ``max(c_f, g)`` forward and ``max(c_b, g + r)`` backward (the stream
    carries the gather and the reduce-scatter), plus each pass's first gather."""
    s = h100_zero3("llama2-7b", nodes)
    profile = no_slowdown("h100-sxm")  # max(): compute beside a collective keeps its speed
    cm = CostModel(s, profile)
    forward, backward = zero3.chunk_units(cm, chunk_work(cm)[0])
    per_mb = sum(max(f.compute, f.gather) + max(b.compute, b.gather + b.reduce)
                 for f, b in zip(forward, backward[::-1], strict=True))
    per_mb += forward[0].gather + backward[0].gather
    result = simulate(s, profile=profile)
    assert result.step_time_s - result.breakdown.optimizer == pytest.approx(
        s.microbatches * per_mb, rel=0.03)


def test_buffers_hold_one_more_gathered_layer_per_prefetch_depth():
    base = h100_zero3("llama2-7b", 8)
    layer = mem.layer_params_per_rank(base.model, 1, 1)[0]
    depth = {d: mem.stage_buffer_bytes(h100_zero3("llama2-7b", 8, zero3_prefetch=d), 0)
             for d in (0, 1, 3)}
    assert depth[1] - depth[0] == pytest.approx(layer * 2)  # bf16 weights
    assert depth[3] - depth[1] == pytest.approx(2 * layer * 2)


def test_negative_prefetch_is_refused():
    with pytest.raises(ScenarioError, match="parallel.zero3_prefetch"):
        h100_zero3("llama2-7b", 1, zero3_prefetch=-1)
