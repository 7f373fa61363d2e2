"""ZeRO-3 under PyTorch's pipelining (framework fsdp, pp > 1: ``ParallelSpec.deferred_zero3``):
whole gradients reduced once after the last backward, each unit gathered in the passes that
find it sharded.

Oracles: FSDP2's rule written out here (a forward reshards its unit; a backward under the
pipelining's ``set_reshard_after_backward(False)`` does not; a pass over a gathered unit
gathers nothing), which gives ``m + 1`` gathers a chunk in any schedule; ZeRO-2 under a
pipeline for the memory (the same states: whole weights and gradients, sharded optimizer);
the ring share for the traffic; the engine for the analytic estimate.
"""

from __future__ import annotations

import pytest
from sim_helpers import no_slowdown

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import zero3
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.costs.dp_reduction import reduction_seconds
from clustersim.simulator.costs.memory import stage_params_per_rank
from clustersim.simulator.costs.traffic import dp_bytes
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.stages import chunks_of_stage


def fsdp(pp: int, schedule: str = "1f1b", v: int = 1, zero: int = 3, m: int = 16,
         framework: str = "fsdp", **parallel):
    """Llama 2 7B on 32 A100s (dp 32 / pp), ``m`` micro-batches of one 2K sequence."""
    dp = 32 // pp
    return build_scenario({
        "model": {"preset": "llama2-7b", "seq_len": 2048},
        "cluster": {"preset": "dgx-a100-80gb", "gpus": 32},
        "training": {"global_batch": m * dp, "micro_batch": 1, "framework": framework},
        "parallel": {"tp": 1, "pp": pp, "dp": dp, "zero": zero, "schedule": schedule,
                     "virtual_stages": v, **parallel}})


def test_the_stacks_say_when_zero_3_reduces_under_a_pipeline():
    assert fsdp(2).parallel.zero3_pipeline_reduce == "step"
    assert fsdp(2).parallel.deferred_zero3 and not fsdp(2).parallel.sharded_gradients
    megatron = fsdp(2, framework="megatron").parallel  # Megatron-FSDP: every micro-batch
    assert megatron.zero3_pipeline_reduce == "microbatch" and megatron.sharded_gradients
    assert not fsdp(1).parallel.deferred_zero3  # without a pipeline FSDP's own hooks reduce
    explicit = fsdp(2, zero3_pipeline_reduce="microbatch").parallel  # a given field wins
    assert not explicit.deferred_zero3 and explicit.sharded_gradients


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                         ("zb-h1", 1), ("zb-v", 2), ("dualpipev", 2)])
def test_every_chunk_gathers_m_plus_1_times_a_step_whatever_the_schedule(schedule, v):
    # a chunk's passes end with a backward, and each pass after a forward (or the first)
    # finds it sharded: 1 + m
    s = fsdp(4, schedule, v)
    for stage in range(4):
        counts = zero3.gathering_passes(s, stage)
        assert set(counts) == set(chunks_of_stage(s, stage))
        assert {f + b for f, b in counts.values()} == {s.microbatches + 1}


def test_1f1b_gathers_in_its_warm_up_forwards_and_every_backward_after_a_forward():
    s = fsdp(4)
    for stage in range(4):
        warmup = 4 - stage - 1  # then the first steady forward, then each backward after one
        assert zero3.gathering_passes(s, stage) == {stage: (warmup + 1, 16 - warmup)}


def test_the_engine_gathers_each_unit_m_plus_1_times_and_reduces_it_once():
    engine = Engine(fsdp(2, m=4), record=True)
    engine.run()
    units = len(engine.work[0].segments)
    for rank in (0, 16):  # the first rank of each stage
        names = [span.name.split()[0] for span in engine.timeline.spans
                 if span.stream == "dp" and span.rank == rank]
        assert names.count("AG") == 5 * units and names.count("grads") == units
        assert names[-units:] == ["grads"] * units  # after every gather: the last backward's


def test_gpipe_gathers_in_every_forward_and_only_the_first_backward():
    assert zero3.gathering_passes(fsdp(2, "gpipe"), 1) == {1: (16, 1)}


def test_its_memory_is_zero_2s_under_a_pipeline_not_the_shards_megatron_fsdp_keeps():
    deferred, zero2 = (simulate(fsdp(2, zero=z)).peak_bytes for z in (3, 2))
    assert deferred == pytest.approx(zero2, rel=1e-9)
    sharded = simulate(fsdp(2, zero3_pipeline_reduce="microbatch")).peak_bytes
    assert sharded < 0.6 * deferred  # docs/modelling.md: "under 0.6 of it"


def test_its_traffic_is_one_reduction_and_m_plus_1_gathers_a_step():
    s = fsdp(2)
    dp, params = s.parallel.dp, sum(stage_params_per_rank(s, 0))
    grad, weight = wl.BYTES[s.training.grad_dtype], wl.BYTES[s.training.precision]
    share = (dp - 1) / dp  # a ring reduce-scatter or all-gather sends this share of its buffer
    assert dp_bytes(s, 0) == pytest.approx(share * params * (grad + 17 * weight), rel=1e-9)
    per_unit = fsdp(2, zero3_pipeline_reduce="microbatch")
    assert dp_bytes(per_unit, 0) == pytest.approx(share * params * 16 * (grad + 2 * weight),
                                                  rel=1e-9)


def test_the_reduction_after_the_last_backward_is_exposed_whole():
    s = fsdp(2)
    cm = CostModel(s)
    _, once = zero3.deferred_exposure(cm, 0)
    assert once == pytest.approx(reduction_seconds(cm, *stage_params_per_rank(s, 0)))


@pytest.mark.parametrize("pp, schedule, v", [(2, "1f1b", 1), (4, "1f1b", 1),
                                             (4, "interleaved", 2)])
def test_engine_and_analytic_agree_within_five_percent(pp, schedule, v):
    s, profile = fsdp(pp, schedule, v), no_slowdown("a100-80gb")
    engine, analytic = simulate(s, profile=profile), estimate(s, profile)
    assert analytic.step_time_s == pytest.approx(engine.step_time_s, rel=0.05)


def test_full_fidelity_runs_it_like_the_representative_engine():
    s = fsdp(2, m=4)
    assert simulate(s, "full").step_time_s == pytest.approx(simulate(s).step_time_s, rel=0.02)
