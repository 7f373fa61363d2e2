"""What makes the walk cheaper (issue 26) changes none of its inputs: the 1F1B and interleaved
lists built in one pass equal their definitions spelled out action by action, the engine's lists
cached per shape equal the lists lowered afresh (and one engine's lists are its own), and the
periodic check's repeating stretch is the one its definition scans for. The walk's answers
themselves are compared with the SimPy engine by ``test_steady_walk.py`` (every schedule and
feature) and ``test_periodic.py``; ``test_the_inline_path_equals_the_engine`` adds the mix that
runs every branch of its inline forward and backward at once."""

from __future__ import annotations

import pytest
from steady_helpers import llama
from test_steady_walk import assert_same_totals

from clustersim.simulator.discrete_event import periodic, walk
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.interleaved import interleaved_1f1b
from clustersim.simulator.pipeline.schedules import (
    Action,
    Kind,
    build_schedule,
    one_f_one_b,
    with_communication,
)
from clustersim.simulator.pipeline.stages import chunk_layout
from clustersim.topologies.profile import profile_for_gpu

F, B = Kind.FORWARD, Kind.BACKWARD


def megatron_interleaved(pp: int, m: int, v: int) -> dict[int, list[Action]]:
    """Megatron-LM's interleaved order, action by action (Narayanan et al. 2021 sec. 2.2.2):
    the k-th forward of
    rank r runs chunk turn ``(k // pp) % v`` of micro-batch ``(k // (pp v)) pp + k % pp``, the
    k-th backward the turns reversed; ``2 (pp - r - 1) + (v - 1) pp`` warm-up forwards (all of
    them at ``m = pp``), then one forward and one backward, then the rest of the backwards."""
    lists = {}
    for r in range(pp):
        def nth(k: int, kind: Kind, r: int = r) -> Action:
            turn = (k // pp) % v
            chunk = (turn if kind is F else v - 1 - turn) * pp + r
            return Action(chunk, kind, (k // (pp * v)) * pp + k % pp)
        total = m * v
        warmup = total if m == pp else min(2 * (pp - r - 1) + (v - 1) * pp, total)
        order = [nth(k, F) for k in range(warmup)]
        for k in range(total - warmup):
            order += [nth(warmup + k, F), nth(k, B)]
        lists[r] = order + [nth(k, B) for k in range(total - warmup, total)]
    return lists


def megatron_schedule_table(pp: int, m: int, v: int, group: int) -> dict[int, list[Action]]:
    """Megatron-LM's interleaved order at any count, transcribed from
    megatron/core/pipeline_parallel/schedules.py: ``get_schedule_table`` (forwards walk groups
    of ``group`` micro-batches through the chunks, the last group to ``m``; backwards the
    chunks reversed), ``get_pp_rank_microbatches`` (``2 (pp - r - 1) + (v - 1) group`` warm-up
    forwards), then one forward and one backward, then the rest of the backwards."""
    table = []
    for start in range(0, m, group):
        end = m if start + group >= m else start + group
        table += [(mb, turn) for turn in range(v) for mb in range(start, end)]
    lists = {}
    for r in range(pp):
        forwards = [Action(turn * pp + r, F, mb) for mb, turn in table]
        backwards = [Action((v - 1 - turn) * pp + r, B, mb) for mb, turn in table]
        warmup = min(2 * (pp - r - 1) + (v - 1) * group, m * v)
        order = forwards[:warmup]
        for k in range(m * v - warmup):
            order += [forwards[warmup + k], backwards[k]]
        lists[r] = order + backwards[m * v - warmup:]
    return lists


@pytest.mark.parametrize(("pp", "v", "m", "group"), [(4, 2, 10, 5), (4, 3, 11, 6), (8, 2, 20, 10),
                                                      (2, 2, 3, 3), (3, 4, 7, 4), (4, 2, 13, 7)])
def test_interleaved_lists_off_the_pp_grid_are_megatrons_table(pp, v, m, group):
    """A count no multiple of pp runs in groups of ``group`` (the smallest that Megatron-LM
    accepts, ``interleaved.microbatch_group``), in Megatron-LM's order."""
    assert interleaved_1f1b(pp, m, v) == megatron_schedule_table(pp, m, v, group)


def test_megatrons_table_in_groups_of_pp_is_its_2021_order():
    """On the pp grid the table with groups of pp is the order ``megatron_interleaved`` spells
    out from Narayanan et al. (the two transcriptions agree where both apply)."""
    for pp, v, groups in ((2, 2, 3), (4, 3, 2), (4, 2, 5)):
        assert (megatron_schedule_table(pp, groups * pp, v, pp)
                == megatron_interleaved(pp, groups * pp, v))


def pipedream_flush(pp: int, m: int) -> dict[int, list[Action]]:
    """1F1B (Narayanan et al. 2021): ``pp - r - 1`` warm-up forwards, then one forward and
    one backward, then the rest of the backwards."""
    lists = {}
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        order = [Action(r, F, i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [Action(r, F, warmup + i), Action(r, B, i)]
        lists[r] = order + [Action(r, B, i) for i in range(m - warmup, m)]
    return lists


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 5, 8])
def test_interleaved_lists_are_megatrons_order(pp):
    for v in (1, 2, 3, 4):
        for groups in (1, 2, 3, 5):
            built = interleaved_1f1b(pp, groups * pp, v)
            assert built == megatron_interleaved(pp, groups * pp, v), (pp, groups, v)
            assert all(type(a) is Action for acts in built.values() for a in acts)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
def test_one_f_one_b_lists_are_pipedream_flush(pp):
    for m in (1, 2, pp, pp + 1, 3 * pp + 2):
        assert one_f_one_b(pp, m) == pipedream_flush(pp, m), (pp, m)


def test_lists_are_each_callers_own():
    """A caller that edits its lists (``test_v_schedules`` drops the pairs of an engine's)
    leaves the next caller's as built."""
    first = interleaved_1f1b(4, 8, 2)
    first[0].clear()
    assert interleaved_1f1b(4, 8, 2) == megatron_interleaved(4, 8, 2)


@pytest.mark.parametrize(("name", "v"), [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                                         ("zb-v", 2), ("dualpipev", 2)])
def test_an_engines_lists_are_the_lowered_lists_of_its_shape(name, v):
    raw = llama(16, schedule=name, pp=4, virtual_stages=v, tp=1, dp=1)
    s = build_scenario(raw)
    engine = Engine(s)
    p = s.parallel
    layout = chunk_layout(p.pp, p.virtual_stages,
                          "v" if name in ("zb-v", "dualpipev") else "loop")
    lists = build_schedule(name, p.pp, s.microbatches, p.virtual_stages)
    lowered = with_communication(lists, engine.chunks, layout.stages, layout.copies)
    assert engine.schedule == {r: tuple(actions) for r, actions in lowered.items()}
    assert engine.passes == {c: sum(1 for acts in lists.values() for a in acts
                                    if a.chunk == c and a.kind in (B, Kind.BACKWARD_WEIGHT))
                             for c in range(engine.chunks)}
    # the engines of a shape share its lists, which none of them can change
    assert all(isinstance(actions, tuple) for actions in engine.schedule.values())
    assert Engine(s).schedule[0] is engine.schedule[0]


def stretch_by_definition(actions, unit: int, step: int) -> tuple[int, int]:
    """The longest (the last of equally long) run of actions each repeated ``unit`` places on
    as the same chunk and kind ``step`` micro-batches later, action by action."""
    best, start = (0, 0), None
    for i in range(len(actions) - unit + 1):
        repeats = i < len(actions) - unit and (
            actions[i + unit].chunk == actions[i].chunk
            and actions[i + unit].kind is actions[i].kind
            and actions[i + unit].microbatch == actions[i].microbatch + step)
        if repeats and start is None:
            start = i
        elif not repeats and start is not None:
            if i - start >= best[1] - best[0]:
                best = (start, i)
            start = None
    return (0, 0) if best == (0, 0) else (best[0], best[1] + unit)


@pytest.mark.parametrize(("name", "v"), [("1f1b", 1), ("interleaved", 2), ("interleaved", 3),
                                         ("zb-h1", 1), ("zb-h2", 1), ("gpipe", 1)])
def test_the_repeating_stretch_is_the_one_its_definition_finds(name, v):
    for pp in (2, 3, 4, 8):
        grid = pp if name == "interleaved" else 1
        for m in range(grid, 6 * pp + 1, grid):
            lowered = with_communication(build_schedule(name, pp, m, v), pp * v)
            for actions in lowered.values():
                for step in {1, grid}:
                    for unit in {1, 3, len(actions) * step // m, len(actions) + 1}:
                        assert periodic._stretch(actions, unit, step) == \
                            stretch_by_definition(actions, unit, step), (pp, m, unit, step)


def test_the_inline_path_equals_the_engine():
    """Interleaved on 4 stages with ZeRO-1 (every first forward waits for its gathered
    parameters, every last backward reduces as it goes: the general path), sequence
    parallelism with ``tp_comm_overlap`` (backwards beside their TP collectives), compute
    slowed beside NCCL and stragglers: the inline forwards and backwards of the rest
    equal the SimPy run, every finish to the last bit."""
    profile = profile_for_gpu("h100-sxm").model_copy(update={"comm_compute_slowdown": 0.2})
    raw = llama(16, schedule="interleaved", pp=4, virtual_stages=2, tp=2, dp=2, zero=1,
                sequence_parallel=True, tp_comm_overlap=True,
                cluster={"variability": {"compute_sigma": 0.02, "slow_fraction": 0.001,
                                         "slow_factor": 1.5}})
    s = build_scenario(raw)
    walked = walk.walked_totals(Engine(s, profile=profile), rows=False)
    assert walked is not None
    assert_same_totals(walked, Engine(s, profile=profile).totals())


def test_remembered_unit_boundaries_are_each_lists_own():
    """``periodic`` remembers each stage's unit boundaries by the shape of its lists; engines
    of other shapes (schedule, depth, count, chunks per rank) walked in between, and one shape
    again with other costs (tp 2, ZeRO-1), get the boundaries their own lists give by the
    stretch's definition, from the scan and again from what was remembered."""
    periodic._MARKS.clear()
    shapes = [("1f1b", 4, 1, 12), ("interleaved", 4, 2, 16), ("interleaved", 4, 3, 16),
              ("interleaved", 4, 2, 24), ("zb-h1", 4, 1, 12), ("zb-h2", 4, 1, 16),
              ("1f1b", 8, 1, 12)]
    for _ in range(2):  # scanned, then remembered
        for name, pp, v, m in shapes:
            for extra in ({}, {"tp": 2, "dp": 2, "zero": 1}):
                e = Engine(build_scenario(llama(m, schedule=name, pp=pp, virtual_stages=v,
                                                **{"tp": 1, "dp": 1, **extra})))
                step = pp if name == "interleaved" else 1
                shape = periodic._shape(e, m, step)
                for r in e.ranks:
                    actions = e.schedule[r.stage]
                    unit = len(actions) * step // m
                    first, last = stretch_by_definition(actions, unit, step)
                    wanted = list(range(last - (last - first) // unit * unit, last + 1, unit))
                    wanted = wanted if len(wanted) > periodic.PERIODS else None
                    assert periodic._marks(shape, r.stage, actions, m, step) == wanted, \
                        (name, pp, v, m, r.stage)


def _run_by_steps(walker, r, recipe) -> None:
    """``_run_recipe``'s general path, step by step (the TP collectives beside the GEMMs they
    overlap, then the rest; or the compute and its exposed collectives): what ``_slowed``
    inlines."""
    compute, tp, hide, rest, parts, exposed = recipe
    if hide:
        start = r.now
        tp_end = start + tp
        walker._compute(r, hide, "compute", (start, tp_end))
        walker._wait(r, tp_end, "tp")
        walker._busy(r, rest, parts, exposed, "compute")
    else:
        walker._busy(r, compute, parts, exposed, "compute")


def test_compute_slowed_beside_nccl_inline_equals_its_steps():
    """``_slowed`` (the inline forward and backward where compute is slowed beside NCCL)
    leaves a rank exactly where the steps it inlines leave it: its clock, when it was
    resumed, its seconds by cause and exposed communication by kind, to the last bit, and
    refuses where they refuse (a compute ending as a collective starts or ends). Random
    recipes (with and without TP collectives beside the compute, exposed or not) from
    random instants, with the DP stream idle or busy before, across or after them."""
    import random

    from clustersim.simulator.discrete_event.walk_rank import Undecided, WalkRank

    s = build_scenario(llama(12, schedule="1f1b", pp=4, tp=1, dp=1))
    engine = Engine(s)
    walker = walk._Walk(engine)
    rng = random.Random(26)

    def state(now, slowdown, busy):
        r = WalkRank(engine.ranks[0], [])
        r.now, r.made, r.slowdown, r.busy = now, now / 2, slowdown, list(busy)
        return r

    def seen(r):
        return (r.now, r.made, r.busy_from, dict(r.clock.seconds), dict(r.clock.comm))

    tried = 0
    for _ in range(3000):
        now = rng.choice([0.0, rng.uniform(0, 5)])
        compute = rng.choice([rng.uniform(1e-4, 2), 0.125])
        hide = rng.choice([0.0, rng.uniform(1e-5, compute)])
        tp = rng.uniform(1e-5, 1.5) if hide else 0.0
        parts = rng.choice([[], [("tp", rng.uniform(0, 0.3))],
                            [("tp", rng.uniform(0, 0.3)), ("ep", rng.uniform(0, 0.2))]])
        recipe = (compute, tp, hide, compute - hide, parts, sum(t for _, t in parts))
        ops, t = [], rng.uniform(0, now + 1)
        for _ in range(rng.choice([0, 0, 1, 3])):
            end = t + rng.uniform(1e-3, 1)
            ops.append((t, end))
            t = end + rng.choice([0.0, rng.uniform(0, 0.5)])
        if rng.random() < 0.05 and ops and ops[0][0] > now:  # ends as a DP op starts
            recipe = (ops[0][0] - now, 0.0, 0.0, ops[0][0] - now, [], 0.0)  # (refused)
        slowdown = rng.choice([0.159, 0.2, 0.5])
        inline, steps = state(now, slowdown, ops), state(now, slowdown, ops)
        try:
            _run_by_steps(walker, steps, recipe)
        except Undecided:
            with pytest.raises(Undecided):
                walker._slowed(inline, recipe)
            continue
        walker._slowed(inline, recipe)
        assert seen(inline) == seen(steps), recipe
        tried += 1
    assert tried > 2500
