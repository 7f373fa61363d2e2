"""``schedule: combined-1f1b``: Megatron-Core's ``--overlap-moe-expert-parallel-comm``
(megatron/core/pipeline_parallel/combined_1f1b.py): interleaved 1F1B with one more warm-up
forward, each steady forward and backward run as one overlapped pair, one half's expert
all-to-alls behind the other half's compute. Oracles: Megatron-Core's warm-up count
(``get_pp_rank_microbatches``), the independence of each pair's halves, and the pair's time by
hand, as DualPipeV's pairs are tested (``test_v_schedules.py``)."""

from __future__ import annotations

import pytest
from sim_helpers import flat_profile, scenario
from test_v_schedules import beside

from clustersim.errors import ScenarioError
from clustersim.reports.megatron import megatron_args
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.pipeline.interleaved import (
    _interleaved_warmup,
    combined_1f1b,
    interleaved_1f1b,
)
from clustersim.simulator.pipeline.schedules import Action, Kind

F, B, PAIR = Kind.FORWARD, Kind.BACKWARD, Kind.OVERLAP_F_B
PAIR_MARKER = Action(0, PAIR, 0)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 12, 3), (8, 16, 4)])
def test_one_more_warmup_forward_then_every_steady_forward_pairs_with_an_earlier_backward(
        pp, m, v):
    combined, plain = combined_1f1b(pp, m, v), interleaved_1f1b(pp, m, v)
    for r, actions in combined.items():
        work = [a for a in actions if a.kind is not PAIR]
        assert sorted(work) == sorted(plain[r])  # every chunk's F and B once
        warmup = min(_interleaved_warmup(r, pp, m, v) + 1, m * v)  # Megatron-Core's + 1
        assert all(a.kind is F for a in work[:warmup])
        assert actions[warmup] == PAIR_MARKER and work[warmup + 1].kind is B
        pairs = [(actions[i + 1], actions[i + 2]) for i, a in enumerate(actions)
                 if a.kind is PAIR]
        assert len(pairs) == m * v - warmup
        for f, b in pairs:  # independent: the backward's own forward ran before
            assert (f.kind, b.kind) == (F, B)
            assert actions.index(b._replace(kind=F)) < actions.index(f)


def test_without_a_pipeline_it_is_megatrons_no_pipelining_form():
    # combined_1f1b_schedule_for_no_pipelining: F0, then (F1, B0), (F2, B1), then B2
    assert [str(a) for a in combined_1f1b(1, 3, 1)[0]] == [
        "0F0", "OVERLAP_F_B", "0F1", "0B0", "OVERLAP_F_B", "0F2", "0B1", "0B2"]


def test_each_rank_holds_one_micro_batch_more_than_interleaved():
    s = scenario(layers=16, micro_batches=16, pp=4, schedule="combined-1f1b", virtual_stages=2)
    plain = scenario(layers=16, micro_batches=16, pp=4, schedule="interleaved", virtual_stages=2)
    for r in range(4):
        assert sum(mem.inflight_microbatches(s, r)) == sum(mem.inflight_microbatches(plain, r)) + 1


def paired_scenario(schedule: str = "combined-1f1b"):
    """One rank (pp 1, no bubble) on NVLink slow enough that each pass's expert all-to-alls
    (8 experts over ep 8) compare with its compute."""
    return scenario(layers=4, micro_batches=6, pp=1, dp=8, ep=8, schedule=schedule,
                    model={"experts": 8, "top_k": 2},
                    cluster={"intra_node": {"bandwidth": 20, "latency": 0.0}})


@pytest.mark.parametrize("slowdown", [0.0, 0.2])
def test_each_pair_hides_one_halfs_alltoalls_behind_the_others_compute(slowdown):
    """Against the same lists with the pairs run apart, each pair saves A_F + A_B less what
    each adds beside the other half's compute (slowed to 1 - x meanwhile)."""
    s = paired_scenario()
    profile = flat_profile(1.0).model_copy(update={"comm_compute_slowdown": slowdown})
    paired, apart = Engine(s, profile=profile), Engine(s, profile=profile)
    apart.schedule = {r: [a for a in acts if a.kind is not PAIR]
                      for r, acts in apart.schedule.items()}
    seg = paired.work[0].whole
    (c_f, a_f), (c_b, a_b) = (seg.pass_times("forward")[0], seg.alltoalls("forward")[0]), (
        seg.pass_times("backward")[0], seg.alltoalls("backward")[0])
    assert a_f > 0.1 * c_f  # the all-to-alls matter here
    pairs = sum(a.kind is PAIR for a in paired.schedule[0])
    assert pairs == 5
    saved = pairs * (a_f + a_b - beside(a_f, c_b, slowdown) - beside(a_b, c_f, slowdown))
    step = paired.run().step_time_s
    assert apart.run().step_time_s - step == pytest.approx(saved, rel=1e-6)
    closed = estimate(s, profile)
    assert closed.step_time_s == pytest.approx(step, rel=0.04)
    # what the pairs hide is not counted as exposed: the breakdown adds up to the step
    b = closed.breakdown
    assert b.compute + b.exposed_comm + b.bubble + b.optimizer == pytest.approx(
        closed.step_time_s, rel=1e-9)


def test_an_moe_pipeline_takes_the_steady_shortcut_exactly_and_the_estimate_agrees():
    s = scenario(layers=16, micro_batches=64, pp=4, dp=8, ep=8, schedule="combined-1f1b",
                 virtual_stages=2, model={"experts": 8, "top_k": 2})
    whole = Engine(s).run()
    assert simulate(s).step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    assert estimate(s).step_time_s == pytest.approx(whole.step_time_s, rel=0.03)
    interleaved = scenario(layers=16, micro_batches=64, pp=4, dp=8, ep=8, schedule="interleaved",
                           virtual_stages=2, model={"experts": 8, "top_k": 2})
    assert whole.step_time_s < simulate(interleaved).step_time_s


@pytest.mark.parametrize(("change", "field"), [
    ({"virtual_stages": 1}, "parallel.virtual_stages: combined-1f1b with pp > 1 runs"),
    ({"recompute": "full"}, "parallel.recompute: combined-1f1b does not run with full"),
    ({"pp": 1, "layers": 8}, "parallel.virtual_stages: combined-1f1b without a pipeline"),
])
def test_what_megatron_refuses_is_bad_input(change, field):
    split = {"layers": 16, "pp": 4, "virtual_stages": 2, **change}
    with pytest.raises(ScenarioError, match=field):
        scenario(micro_batches=16, dp=8, ep=8, schedule="combined-1f1b",
                 model={"experts": 8, "top_k": 2}, **split)


def test_megatron_arguments_name_the_overlap():
    s = scenario(layers=16, micro_batches=16, pp=4, dp=8, ep=8, schedule="combined-1f1b",
                 virtual_stages=2, model={"experts": 8, "top_k": 2})
    args = megatron_args(s)
    assert "--overlap-moe-expert-parallel-comm" in args
    assert "--num-virtual-stages-per-pipeline-rank 2" in args
