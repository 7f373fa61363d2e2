"""ZB-V (Qi et al. 2024, sec. 6) and DualPipeV (DeepSeek-AI 2024): two chunks per rank placed
in a V, their orders against PyTorch's, their bubble and memory against the published
comparisons, and the engine."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import schedule_oracle as oracle
from sim_helpers import flat_profile, scenario

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.pipeline.schedules import (
    Action,
    Kind,
    format_schedule,
    one_f_one_b,
    with_communication,
    zero_bubble_h1,
)
from clustersim.simulator.pipeline.stages import chunk_stages, chunks_of_stage, head_stage
from clustersim.simulator.pipeline.v_schedules import dualpipe_v, zero_bubble_v

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def test_v_placement_goes_down_the_ranks_and_back_up():
    """PyTorch's style "v": chunk c on rank c for c < pp, then 2pp - 1 - c."""
    assert chunk_stages(4, 2, "v") == (0, 1, 2, 3, 3, 2, 1, 0)
    assert chunk_stages(4, 2, "loop") == (0, 1, 2, 3, 0, 1, 2, 3)
    pytorch = pytest.importorskip("torch.distributed.pipelining._utils")
    assert chunk_stages(4, 2, "v") == tuple(
        pytorch.generate_stage_to_rank_mapping(4, 8, style="v")[c] for c in range(8))


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_each_rank_runs_both_its_chunks_forward_input_and_weight_once(pp, m):
    for r, actions in zero_bubble_v(pp, m).items():
        mine = (r, 2 * pp - 1 - r)
        assert Counter(actions) == Counter(
            [Action(c, k, i) for c in mine for k in (F, I, W) for i in range(m)])


@pytest.mark.parametrize(("pp", "m"), [(2, 1), (2, 3), (4, 4), (4, 7), (4, 8), (8, 16)])
def test_golden_order_matches_pytorchs_zbv(pp, m):
    """PyTorch's ScheduleZBVZeroBubble builds each rank's list in
    ``_calculate_single_rank_operations``; ours is the same list, no-ops aside."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = format_schedule(zero_bubble_v(pp, m)).splitlines()
    for r in range(pp):
        state = SimpleNamespace(pp_group_size=pp, num_stages=2 * pp, _n_microbatches=m)
        ops = schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations(state, r)
        assert ",".join(str(a) for a in ops if a is not None) == ours[r]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m", [16, 32])
def test_bubble_is_near_zero_where_zbh1_keeps_a_third_of_1f1bs(pp, m):
    """Equal F, B and W and free sends (sail-sg's comparison: bubble rate 1F1B (p-1)/m, ZB-H1
    (p-1)/3m, ZB-V 0): ZB-V idles only while the first micro-batch runs down the V's first
    arm, (p - 1) half-stage forwards, half of ZB-H1's bubble and a sixth of 1F1B's."""
    t = 1.0  # per whole stage; a ZB-V chunk is half a stage
    work = m * 3 * t
    v, _ = oracle.execute(zero_bubble_v(pp, m), 2 * pp, {F: t / 2, I: t / 2, W: t / 2})
    h1, _ = oracle.execute(zero_bubble_h1(pp, m), pp, {F: t, I: t, W: t})
    one, _ = oracle.execute(one_f_one_b(pp, m), pp, {F: t, B: 2 * t})
    assert v - work == pytest.approx((pp - 1) * t / 2)
    assert (v - work) / (one - work) == pytest.approx(1 / 6)
    assert (v - work) / (h1 - work) == pytest.approx(1 / 2)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_every_rank_holds_1f1bs_first_stage_peak(pp):
    """Published: ZB-V's activation memory is 1x 1F1B's, on every rank (2p half-stage chunks
    = p whole micro-batches); the memory model reads the same from the lists."""
    m = 4 * pp
    _, peak = oracle.execute(zero_bubble_v(pp, m), 2 * pp, {F: 1, I: 1, W: 1})
    s = scenario(layers=2 * pp, micro_batches=m, pp=pp, schedule="zb-v", virtual_stages=2)
    for r in range(pp):
        assert peak[r] == 2 * pp
        assert sum(mem.inflight_microbatches(s, r)) == 2 * pp


def test_the_turn_of_the_v_needs_no_send():
    """Chunks pp - 1 and pp share the last rank: its forward output stays there."""
    lowered = with_communication(zero_bubble_v(2, 2), 4, chunk_stages(2, 2, "v"))
    assert Action(1, Kind.SEND_F, 0) not in lowered[1]
    assert Action(2, Kind.RECV_F, 0) not in lowered[1]
    assert Action(0, Kind.SEND_F, 0) in lowered[0] and Action(3, Kind.RECV_F, 0) in lowered[0]


def zbv(**kw):
    return scenario(layers=16, micro_batches=16, pp=4, schedule="zb-v", virtual_stages=2, **kw)


def test_the_first_rank_holds_embedding_and_head():
    s = zbv()
    assert head_stage(s) == 0 and chunks_of_stage(s, 0) == [0, 7]
    dense = [mem.stage_params_per_rank(s, i)[0] for i in range(4)]
    assert dense[0] > dense[1] == dense[2] == dense[3]


def test_engine_and_list_scheduled_estimate_agree_and_beat_1f1b_and_zbh1():
    """The closed form list-schedules the same actions (``list_schedule.py``); both see
    ZB-V's smaller bubble than ZB-H1's and 1F1B's on the same model and links."""
    profile = flat_profile()
    engine = Engine(zbv(), profile=profile).run()
    closed = estimate(zbv(), profile)
    assert engine.step_time_s == pytest.approx(closed.step_time_s, rel=0.03)
    for sim, formula in zip(engine.per_stage, closed.per_stage, strict=True):
        assert sim.activations == pytest.approx(formula.activations, rel=0.05)
    others = {name: Engine(scenario(layers=16, micro_batches=16, pp=4, schedule=name),
                           profile=profile).run() for name in ("1f1b", "zb-h1")}
    assert engine.breakdown.bubble < others["zb-h1"].breakdown.bubble
    assert engine.breakdown.bubble < others["1f1b"].breakdown.bubble / 3


def test_zbv_runs_two_chunks_per_rank():
    with pytest.raises(ValueError, match="virtual_stages: 2"):
        scenario(layers=16, micro_batches=16, pp=4, schedule="zb-v")
    with pytest.raises(ValueError, match="chunk"):
        zero_bubble_v(4, 8, 4)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (2, 5), (3, 9), (4, 8), (4, 10), (8, 16)])
def test_golden_order_matches_pytorchs_dualpipev(pp, m):
    """PyTorch's ScheduleDualPipeV, each OVERLAP_F_B pair as the marker, its forward, then
    its backward."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = format_schedule(dualpipe_v(pp, m)).splitlines()
    for r in range(pp):
        state = SimpleNamespace(pp_group_size=pp, _n_microbatches=m)
        ops = schedules.ScheduleDualPipeV._calculate_single_rank_operations(state, r)
        flat = [x for a in ops if a is not None
                 for x in (("OVERLAP_F_B", *a.sub_actions) if a.sub_actions else (a,))]
        assert ",".join(str(a) for a in flat) == ours[r]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("extra", [0, 3])
def test_dualpipev_runs_every_microbatch_once_and_holds_pp_plus_one(pp, extra):
    """Every chunk's forward and gradients once per micro-batch (whole or as two halves). Each
    rank holds 2pp + 1 chunk-micro-batches at its peak: DualPipe's published "PP + 1" with
    PP = 2pp chunks of the same size, the model "cut in half" onto pp ranks."""
    m = 2 * pp + extra
    schedule = dualpipe_v(pp, m)
    _, peak = oracle.execute(schedule, 2 * pp, {F: 1, B: 2, I: 1, W: 1})
    for r, actions in schedule.items():
        for c in (r, 2 * pp - 1 - r):
            for i in range(m):
                mine = [a.kind for a in actions if a.chunk == c and a.microbatch == i
                        and a.kind is not Kind.OVERLAP_F_B]
                assert mine in ([F, B], [F, I, W])
        assert peak[r] == 2 * pp + 1
    s = scenario(layers=4 * pp, micro_batches=m, pp=pp, schedule="dualpipev", virtual_stages=2)
    assert all(sum(mem.inflight_microbatches(s, r)) == 2 * pp + 1 for r in range(pp))


def test_dualpipev_engine_and_estimate_agree():
    profile = flat_profile()
    s = scenario(layers=16, micro_batches=16, pp=4, schedule="dualpipev", virtual_stages=2)
    engine = Engine(s, profile=profile).run()
    assert engine.step_time_s == pytest.approx(estimate(s, profile).step_time_s, rel=0.03)


def test_dualpipev_needs_two_microbatches_per_rank():
    with pytest.raises(ValueError, match="at least 2 \\* pp = 8"):
        scenario(layers=16, micro_batches=6, pp=4, schedule="dualpipev", virtual_stages=2)


def paired_scenario(bandwidth: float = 20, moe: bool = True):
    """One rank's pipeline (pp 1: no bubble, every action back to back) on slow NVLink so that
    each pass's communication is comparable to its compute: the expert all-to-alls of 8 experts
    over ep 8, or (``moe`` false) tp 8's collectives, all exposed when run apart (no backward
    overlap, which would slow the compute beside it)."""
    links = {"intra_node": {"bandwidth": bandwidth, "latency": 0.0}}
    if moe:
        return scenario(layers=4, micro_batches=6, pp=1, dp=8, ep=8, schedule="dualpipev",
                        virtual_stages=2, model={"experts": 8, "top_k": 2}, cluster=links)
    return scenario(layers=4, micro_batches=6, pp=1, tp=8, schedule="dualpipev",
                    virtual_stages=2, tp_backward_overlap=False, cluster=links)


def beside(comm: float, compute: float, x: float) -> float:
    """Hand oracle: what ``comm`` adds beside ``compute`` slowed to ``1 - x`` meanwhile."""
    if comm * (1 - x) >= compute:  # the compute ends first, the pair when the comm does
        return comm - compute
    return x * comm  # the comm ends first, having cost the compute x comm of its work


def paired_and_apart(s, profile) -> tuple[Engine, Engine]:
    """Engines of ``s`` with DualPipeV's overlapped pairs, and with each pair run apart."""
    paired = Engine(s, profile=profile)
    apart = Engine(s, profile=profile)
    apart.schedule = {r: [a for a in acts if a.kind is not Kind.OVERLAP_F_B]
                      for r, acts in apart.schedule.items()}
    return paired, apart


# Communication longer than the other half's compute (NVLink at 20 GB/s), and about as long
# (200 GB/s, GEMMs at a tenth of peak), where the slowdown decides what a pair adds.
@pytest.mark.parametrize(("slowdown", "bandwidth", "efficiency"),
                         [(0.0, 20, 1.0), (0.2, 20, 1.0), (0.0, 200, 0.1), (0.2, 200, 0.1)])
def test_each_overlapped_pair_hides_one_halfs_alltoalls_behind_the_others_compute(
        slowdown, bandwidth, efficiency):
    """DualPipe's F&B: a forward and a backward run as a pair take C_F + C_B plus what each
    half's expert all-to-alls A add beside the other half's compute; run apart they take
    C_F + A_F + C_B + A_B. Without a slowdown a pair adds max(0, A_F - C_B) + max(0, A_B - C_F);
    with compute running at 1 - x beside communication (NCCL takes SMs) it adds at least x A.
    The difference between the step with and without pairs is the hand-computed sum."""
    s = paired_scenario(bandwidth)
    profile = flat_profile(efficiency).model_copy(update={"comm_compute_slowdown": slowdown})
    paired, apart = paired_and_apart(s, profile)
    pairs = []
    actions = [a for a in paired.schedule[0] if a.kind in (F, B, Kind.OVERLAP_F_B)]
    for i, a in enumerate(actions):
        if a.kind is Kind.OVERLAP_F_B:
            pairs.append((actions[i + 1].chunk, actions[i + 2].chunk))
    assert len(pairs) >= 4

    def halves(chunk: int, way: str) -> tuple[float, float]:
        seg = paired.work[chunk].whole
        return seg.pass_times(way)[0], seg.alltoalls(way)[0]

    saved = 0.0
    for f_chunk, b_chunk in pairs:
        (c_f, a_f), (c_b, a_b) = halves(f_chunk, "forward"), halves(b_chunk, "backward")
        assert a_f > 0.1 * c_f  # the communication matters here
        saved += a_f + a_b - beside(a_f, c_b, slowdown) - beside(a_b, c_f, slowdown)
    step_apart, step_paired = apart.run().step_time_s, paired.run().step_time_s
    assert step_apart - step_paired == pytest.approx(saved, rel=1e-6)
    # The closed form (list_schedule) spreads a stage's communication evenly over its passes
    # and pairs; without pairs (1F1B) it equals the engine on this step.
    assert estimate(s, profile).step_time_s == pytest.approx(step_paired, rel=0.04)


def test_a_pair_does_not_hide_tensor_parallel_collectives():
    """DualPipe overlaps "both all-to-all and PP communication" (DeepSeek-V3 report, sec.
    3.2.1), and Megatron-Core's combined 1F1B refuses its overlap without expert parallelism:
    the TP collectives between a chunk's own GEMMs stay exposed, so on a dense model the pairs
    change nothing, in the engine and in the closed form."""
    s = paired_scenario(moe=False)
    profile = flat_profile(1.0)
    paired, apart = paired_and_apart(s, profile)
    tp = paired.work[0].whole.pass_times("forward")[1]
    assert tp > 0.1 * paired.work[0].whole.forward  # the collectives matter here
    step = paired.run().step_time_s
    assert step == pytest.approx(apart.run().step_time_s, rel=1e-12)
    assert estimate(s, profile).step_time_s == pytest.approx(step, rel=0.03)
