"""Clusters made of pools: each stage costed on its pool's GPU, links and memory.

Oracles: the 1F1B pipeline with one slow stage by hand (stage 1 the bottleneck runs its m
forwards and backwards back to back, so step = F_0 + m (F_1 + B_1) + B_0), a GPU with half
the peak taking twice as long, MFU over the pools' summed peaks, the alpha-beta send
``alpha + X/B`` over the slower of two links, and a cluster of one pool being that cluster.
"""

from __future__ import annotations

import pytest
from sim_helpers import FREE, PEAK, flat_profile

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form import analytic as an
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import workload as wl
from clustersim.simulator.planning.balance import balanced_stage_layers, water_fill
from clustersim.topologies.hardware import GpuSpec, gpu_presets

MODEL = {"layers": 8, "hidden": 512, "heads": 8, "vocab": 8, "seq_len": 256}
# Both GPUs named "any", flat_profile's GPU, so one profile prices both; element-wise kernels
# and the optimizer (HBM-bound) cost nothing, so compute is GEMMs alone: half the peak, twice
# the time.
FAST = {"preset": "h100-sxm", "id": "any", "memory_bandwidth": 1e12}
SLOW = {**FAST, "peak_flops": {"bf16": PEAK / 2, "fp16": PEAK / 2, "fp32": 33e12}}


def pool(gpu: dict, gpus: int = 1, **links) -> dict:
    return {"preset": "dgx-h100", "gpus": gpus, "gpus_per_node": 1, "gpu": gpu,
            "intra_node": FREE, "inter_node": FREE, **links}


def mixed(pools: list[dict], micro_batches: int = 8, **parallel) -> object:
    return build_scenario({
        "model": MODEL, "cluster": {"pools": pools},
        "training": {"global_batch": micro_batches, "micro_batch": 1},
        "parallel": {"pp": len(pools), **parallel}})


def plain(gpu: dict, micro_batches: int = 8, **parallel) -> object:
    return build_scenario({
        "model": MODEL, "cluster": pool(gpu, gpus=parallel.get("pp", 1)),
        "training": {"global_batch": micro_batches, "micro_batch": 1}, "parallel": parallel})


@pytest.mark.parametrize("layers", [[4, 4], [5, 3], [2, 6]])
def test_a_stage_on_gpus_half_as_fast_sets_the_1f1b_step(layers):
    """Stage 1 on the slow pool: its forwards and backwards take twice the fast GPU's, and
    the 1F1B step is F_0 + m (F_1 + B_1) + B_0 (the fast stage fills and drains it)."""
    m = 8
    fast_cm = an.CostModel(plain(FAST, m, pp=2, stage_layers=layers), flat_profile())
    s0, s1 = (an.stage_times(fast_cm, i) for i in (0, 1))
    step = s0.forward + m * 2 * (s1.forward + s1.backward) + s0.backward
    s = mixed([pool(FAST), pool(SLOW)], m, stage_layers=layers)
    assert estimate(s, flat_profile()).step_time_s == pytest.approx(step, rel=1e-6)
    assert simulate(s, profile=flat_profile()).step_time_s == pytest.approx(step, rel=1e-6)


def test_mfu_divides_by_every_gpus_own_peak():
    """One H100-class GPU and one at half its peak: MFU = model FLOPs / (step (P + P/2))."""
    s = mixed([pool(FAST), pool(SLOW)], stage_layers=[5, 3])
    r = estimate(s, flat_profile())
    assert r.mfu == pytest.approx(wl.model_flops_per_step(s) / r.step_time_s / (1.5 * PEAK))


def test_a_send_between_pools_crosses_the_slower_inter_node_link():
    """alpha + X/B with the smaller bandwidth and the larger latency of the two pools."""
    slow_net = {"bandwidth": 10, "latency": 3e-6}
    s = mixed([pool(FAST, inter_node={"bandwidth": 40, "latency": 1e-6}),
               pool(FAST, inter_node=slow_net)])
    costs = StageCosts(s, flat_profile())
    message = wl.pipeline_message_bytes(s)
    assert message == 256 * 512 * 2  # one micro-batch's activation in bf16
    links = costs.stage_send_links(0, message)
    assert links.inter.bandwidth == 10e9 and links.inter.latency == 3e-6
    comm = an.stage_times(costs.stage(0), 0, links).comm
    assert comm == pytest.approx(2 * (3e-6 + message / 10e9))  # activation out, gradient back


@pytest.mark.parametrize("parallel", [{"tp": 8, "pp": 2}, {"tp": 2, "pp": 4, "zero": 1},
                                      {"tp": 4, "pp": 2, "schedule": "interleaved",
                                       "virtual_stages": 2}])
def test_a_cluster_of_one_pool_is_that_cluster(parallel):
    """Pools change nothing when there is one: same step, breakdown and memory, both ways."""
    cluster = {"preset": "dgx-h100", "gpus": 64}
    raw = {"model": {"preset": "gpt-1.7b"}, "cluster": cluster,
           "training": {"global_batch": 64}, "parallel": parallel}
    one = build_scenario({**raw, "cluster": {"pools": [cluster]}})
    base = build_scenario(raw)
    for run in (estimate, simulate):
        a, b = run(one), run(base)
        assert a.step_time_s == b.step_time_s and a.breakdown == b.breakdown
        assert [st.peak_bytes for st in a.per_stage] == [st.peak_bytes for st in b.per_stage]
        assert a.mfu == b.mfu and a.fits == b.fits


def test_each_stage_is_held_to_its_own_pools_memory():
    """The same stages fit 80 GB but not 40 GB GPUs: the stage on the 40 GB pool is the OOM,
    and the result's capacity is the smaller GPU's (each what its tensors may use)."""
    big = {"preset": "dgx-a100-80gb", "gpus": 8}
    small = {"preset": "dgx-a100-40gb", "gpus": 8}
    raw = {"model": {"preset": "gpt-1.7b"}, "training": {"global_batch": 256, "micro_batch": 16},
           "parallel": {"tp": 1, "pp": 2}}
    r = estimate(build_scenario({**raw, "cluster": {"pools": [big, small]}}))
    gb80, gb40 = (GpuSpec.model_validate({**gpu_presets()[g], "id": g}).tensor_memory_bytes
                  for g in ("a100-80gb", "a100-40gb"))
    peaks = [st.peak_bytes for st in r.per_stage]
    assert min(peaks) > gb40 and max(peaks) < gb80  # fits only the 80 GB GPUs
    assert [(st.pool, st.capacity_bytes) for st in r.per_stage] == [(0, gb80), (1, gb40)]
    assert r.capacity_bytes == gb40 and not r.fits
    stages = r.to_json()["memory"]["per_stage"]
    assert [(st["pool"], st["capacity_bytes"]) for st in stages] == [(0, gb80), (1, gb40)]


def test_stages_fill_the_pools_in_order_unless_placed():
    pools = [pool(FAST, gpus=2), pool(SLOW, gpus=1)]
    assert mixed(pools, pp=3).parallel.stage_pools == [0, 0, 1]
    assert mixed(pools, pp=3, stage_pools=[0, 1, 0]).parallel.stage_pools == [0, 1, 0]
    with pytest.raises(ScenarioError, match=r"pool 0 .* 3 GPUs, not whole stages of .* = 2"):
        mixed([pool(FAST, gpus=3), pool(SLOW, gpus=1)], pp=2)


@pytest.mark.parametrize("change, field", [
    ({"stage_pools": [0, 2]}, "parallel.stage_pools"),  # unknown pool
    ({"stage_pools": [0, 0]}, "parallel.stage_pools"),  # pool 1 left without its stage
    ({"stage_pools": [0]}, "parallel.stage_pools"),  # one entry per stage
    ({"order": "pp-tp-cp-dp"}, "parallel.order"),  # a stage's GPUs would span pools
])
def test_stage_placement_mistakes_name_the_field(change, field):
    with pytest.raises(ScenarioError) as err:
        mixed([pool(FAST), pool(SLOW)], **change)
    assert err.value.field == field


# --- balancing the stages' layers -------------------------------------------------------------

def test_water_filling_minimises_the_slowest_stage_by_hand():
    """12 layers, the second stage's layer twice as slow: 8 + 4 (8 = 4 x 2). With 2 more
    seconds on it (the head), 9 + 3: max(9, 3 x 2 + 2) = 9 beats 8 + 4's max(8, 10) = 10."""
    assert water_fill(12, [1.0, 2.0], [0.0, 0.0]) == [8, 4]
    assert water_fill(12, [1.0, 2.0], [0.0, 2.0]) == [9, 3]
    assert water_fill(12, [1.0, 2.0], [0.0, 0.0], least=5) == [7, 5]


@pytest.mark.parametrize("speeds, layers, expected", [
    ([1, 2], 12, [8, 4]), ([2, 1], 12, [4, 8]), ([1, 2, 3], 11, [6, 3, 2])])
def test_balanced_layers_are_proportional_to_each_pools_speed(speeds, layers, expected):
    """GPUs at 1/k of the peak take k times as long per layer, so they get 1/k of the
    layers (the tiny vocabulary's head is ~1e-4 of a stage and moves nothing)."""
    gpus = [{**FAST, "peak_flops": {"bf16": PEAK / k, "fp16": PEAK / k, "fp32": 60e12 / k}}
            for k in speeds]
    s = build_scenario({"model": {**MODEL, "layers": layers},
                        "cluster": {"pools": [pool(g) for g in gpus]},
                        "training": {"global_batch": 8}, "parallel": {"pp": len(speeds)}})
    assert balanced_stage_layers(s, flat_profile()) == expected


def test_balancing_a_slow_pools_stage_shortens_the_step():
    """9 layers, the second stage's GPU half as fast: 6 + 3 (6 layer-times each) rather than
    the even 5 + 4 (8 layer-times on the slow stage)."""
    def scenario(layers):
        return build_scenario({"model": {**MODEL, "layers": 9},
                               "cluster": {"pools": [pool(FAST), pool(SLOW)]},
                               "training": {"global_batch": 8},
                               "parallel": {"pp": 2, "stage_layers": layers}})
    even = scenario(None)
    assert even.parallel.stage_layers is None and balanced_stage_layers(
        even, flat_profile()) == [6, 3]
    step = {layers: simulate(scenario(layers), profile=flat_profile()).step_time_s
            for layers in ((5, 4), (6, 3))}
    assert step[(6, 3)] < 0.8 * step[(5, 4)]  # about 6 / 8 of it


def test_interleaved_stages_split_their_balanced_layers_over_their_chunks():
    """16 layers, 2 chunks a stage: 11 on the fast stage (11 x 1 against 5 x 2), as 6 + 5,
    and 5 on the slow one as 3 + 2, in model order (chunk c on stage c % pp)."""
    s = build_scenario({
        "model": {**MODEL, "layers": 16}, "cluster": {"pools": [pool(FAST), pool(SLOW)]},
        "training": {"global_batch": 8},
        "parallel": {"pp": 2, "schedule": "interleaved", "virtual_stages": 2}})
    assert balanced_stage_layers(s, flat_profile()) == [6, 3, 5, 2]
