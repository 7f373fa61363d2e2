"""Pipeline schedules: complete, deadlock-free, with the closed-form bubble and memory."""

from __future__ import annotations

from collections import Counter

import pytest
import schedule_oracle as oracle

from clustersim.simulator.pipeline.interleaved import interleaved_1f1b
from clustersim.simulator.pipeline.schedules import (
    Action,
    Kind,
    build_schedule,
    format_schedule,
    gpipe,
    memory_grows_with_microbatch,
    one_f_one_b,
    schedule_named,
    with_communication,
)

F, B = Kind.FORWARD, Kind.BACKWARD


def execute(schedule, pp: int, v: int, t_f: float, t_b: float) -> tuple[float, dict[int, int]]:
    """The list-scheduling oracle (``schedule_oracle.py``) with whole backwards."""
    return oracle.execute(schedule, pp * v, {F: t_f, B: t_b})


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_each_rank_runs_every_microbatch_once_each_way(name, pp, m):
    schedule = build_schedule(name, pp, m)
    for r, actions in schedule.items():
        assert Counter(actions) == Counter(
            [Action(r, k, i) for k in (F, B) for i in range(m)])


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(name, pp, m):
    """Equal stages, free sends: bubble (p-1)/(m+p-1) of the step (Narayanan et al. 2021)."""
    t_f, t_b = 1.0, 2.0
    makespan, _ = execute(build_schedule(name, pp, m), pp, 1, t_f, t_b)
    ideal = m * (t_f + t_b)
    assert (makespan - ideal) / makespan == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-9)


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (4, 2, 8), (4, 4, 16), (8, 2, 16), (2, 3, 6),
                                      (4, 2, 10), (4, 3, 11), (8, 2, 20), (2, 2, 3)])
def test_interleaving_shrinks_the_bubble_to_p_minus_1_over_v_m(pp, v, m):
    """Interleaved 1F1B: bubble time (p-1)(t_f+t_b)/v, i.e. (p-1)/(v m) of the ideal time."""
    t_f, t_b = 1.0, 2.0  # per stage; each of the v chunks takes 1/v of it
    makespan, _ = execute(interleaved_1f1b(pp, m, v), pp, v, t_f / v, t_b / v)
    ideal = m * (t_f + t_b)
    assert (makespan - ideal) / ideal == pytest.approx((pp - 1) / (v * m), rel=1e-9)


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 8), (4, 2)])
def test_activation_memory_in_flight(pp, m):
    """GPipe keeps all m micro-batches; 1F1B at most p - rank (Narayanan et al. 2021)."""
    _, peak_gpipe = execute(gpipe(pp, m), pp, 1, 1.0, 2.0)
    _, peak_1f1b = execute(one_f_one_b(pp, m), pp, 1, 1.0, 2.0)
    assert all(peak_gpipe[r] == m for r in range(pp))
    assert all(peak_1f1b[r] == min(pp - r, m) for r in range(pp))


def megatron_group(pp: int, m: int) -> int:
    """The smallest ``--microbatch-group-size-per-virtual-pipeline-stage`` Megatron-LM runs:
    in ``[pp, m]``, its remainder ``m % N`` 0 or at least ``pp``
    (megatron/core/pipeline_parallel/schedules.py, the interleaved schedule's checks)."""
    return min(n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp)


@pytest.mark.parametrize("pp, v, m", [(4, 2, 8), (4, 3, 12), (2, 2, 4), (4, 2, 4), (4, 2, 10),
                                      (4, 3, 11), (8, 4, 12), (3, 2, 7)])
def test_interleaved_warmup_holds_megatrons_count(pp, v, m):
    """Rank r holds 2(p - r - 1) + (v - 1)N + 1 chunk-micro-batches for group size N (p where
    m is a multiple of it; capped at m v); with m == p Megatron-LM runs every forward first,
    so every rank holds all m v."""
    _, peak = execute(interleaved_1f1b(pp, m, v), pp, v, 1.0, 2.0)
    group = megatron_group(pp, m)
    for r in range(pp):
        expected = m * v if m == pp else min(2 * (pp - r - 1) + (v - 1) * group + 1, m * v)
        assert peak[r] == expected


@pytest.mark.parametrize("pp, v, m", [(4, 2, 8), (4, 3, 12), (2, 2, 4), (4, 2, 4), (8, 4, 24),
                                      (5, 3, 10), (3, 5, 9), (4, 2, 10), (4, 3, 11), (8, 2, 20)])
def test_interleaved_held_per_chunk_is_the_warmup_in_list_order(pp, v, m):
    """What the memory model holds per chunk (the schedule's ``held``) is what each rank's
    first forwards run, in its own list's order, up to Megatron-LM's warm-up count."""
    lists = interleaved_1f1b(pp, m, v)
    for r in range(pp):
        held = schedule_named("interleaved").held(pp, m, v, r)
        forwards = [a.chunk // pp for a in lists[r] if a.kind is F][:sum(held)]
        counts = Counter(forwards)
        assert held == [counts[chunk] for chunk in range(v)]


def test_golden_1f1b_matches_pytorch_order():
    """PyTorch's Schedule1F1B for 4 stages and 8 micro-batches, rank 0 and rank 3."""
    rows = format_schedule(one_f_one_b(4, 8)).splitlines()
    assert rows[0] == "0F0,0F1,0F2,0F3,0B0,0F4,0B1,0F5,0B2,0F6,0B3,0F7,0B4,0B5,0B6,0B7"
    assert rows[3] == "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7"


def test_interleaved_places_chunk_c_on_rank_c_mod_p():
    for r, actions in interleaved_1f1b(4, 8, 3).items():
        assert {a.chunk % 4 for a in actions} == {r}


def test_unknown_schedule_lists_the_options():
    options = (r"valid options are \['1f1b', 'combined-1f1b', 'dualpipe', 'dualpipev', 'gpipe', "
               r"'interleaved', 'zb-h1', 'zb-h2', 'zb-v'\]")
    with pytest.raises(ValueError, match=options):
        build_schedule("zero-bubble", 4, 8)


def _held_at(pp: int, v: int, share: int, mb: int) -> int:
    """Activations a replica's busiest stage holds, in micro-batches of one sequence, when its
    ``share`` of the batch runs in micro-batches of ``mb``."""
    m = share // mb
    return mb * max(sum(schedule_named("interleaved").held(pp, m, v, r)) for r in range(pp))


@pytest.mark.parametrize("pp, v", [(2, 2), (3, 4), (4, 2), (8, 3)])
def test_interleaved_on_the_grid_holds_no_less_at_any_larger_micro_batch(pp, v):
    """What lets the planner skip a split's larger micro-batches once one is out of memory
    (``memory_grows_with_microbatch``), checked on every share of the batch to 300 sequences
    and every micro-batch that divides it into at least pp."""
    for share in range(pp, 301):
        mbs = [mb for mb in range(1, share + 1) if share % mb == 0 and share // mb >= pp]
        for i, mb in enumerate(mbs):
            grows = memory_grows_with_microbatch("interleaved", pp, share // mb)
            assert grows == (share // mb % pp == 0)
            if grows:
                assert all(_held_at(pp, v, share, larger) >= _held_at(pp, v, share, mb)
                           for larger in mbs[i + 1:]), (share, mb)


def test_interleaved_off_the_grid_can_hold_more_than_a_larger_micro_batch():
    """25 micro-batches at pp 2 run in groups of 5 and warm up with 2 + 5 forwards; micro-batch
    5 (20 of them, groups of 2) holds less: the planner does not skip past it."""
    assert _held_at(2, 2, 100, 4) == 4 * 8 and _held_at(2, 2, 100, 5) == 5 * 5
    assert not memory_grows_with_microbatch("interleaved", 2, 25)
    assert not memory_grows_with_microbatch("zb-v", 2, 8)  # a split backward never does


def test_interleaved_needs_at_least_pp_microbatches():
    with pytest.raises(ValueError, match="at least pp"):
        interleaved_1f1b(4, 3, 2)


def test_communication_is_made_explicit_like_pytorchs_lowering():
    lowered = with_communication(one_f_one_b(2, 2), chunks=2)
    assert format_schedule(lowered).splitlines() == [
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1",
    ]


@pytest.mark.parametrize("name, pp, m, v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_every_send_meets_one_receive_on_the_neighbour(name, pp, m, v):
    """SEND_F of chunk c pairs with RECV_F of chunk c+1 (on rank (c+1) % pp); SEND_B of c
    with RECV_B of c-1: each message sent exactly once and received exactly once."""
    lowered = with_communication(build_schedule(name, pp, m, v), chunks=pp * v)
    actions = [(r, a) for r, acts in lowered.items() for a in acts]
    sends = Counter((a.chunk + (1 if a.kind is Kind.SEND_F else -1), a.microbatch, a.kind)
                    for _, a in actions if a.kind in (Kind.SEND_F, Kind.SEND_B))
    receives = Counter((a.chunk, a.microbatch, Kind.SEND_F if a.kind is Kind.RECV_F
                        else Kind.SEND_B) for r, a in actions
                       if a.kind in (Kind.RECV_F, Kind.RECV_B) and r == a.chunk % pp)
    assert sends == receives
    assert len(sends) == 2 * m * (pp * v - 1)
