"""The periodic shortcut (``simulator/discrete_event/periodic.py``): one short walk whose last
units repeat, extended to the whole step, equals the whole simulation by SimPy (the oracle:
``Engine.run``) in every field of its JSON form, on every registered schedule that takes it,
and is refused by the others and wherever the regime has not settled."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from steady_helpers import FEATURES as STEADY_FEATURES
from steady_helpers import STRAGGLERS, assert_same, llama

from clustersim.simulator.discrete_event import periodic, steady, walk
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.schedules import SCHEDULES, schedule_named
from clustersim.topologies.profile import profile_for_gpu

# (schedule, chunks per rank) of every registered schedule
CHUNKS = {"gpipe": (1,), "1f1b": (1,), "zb-h1": (1,), "zb-h2": (1,), "interleaved": (2, 3),
          "zb-v": (2,), "dualpipev": (2,), "dualpipe": (2,), "combined-1f1b": (2, 3)}
# GPipe's lists grow at two places (forwards, backwards), ZB-V declares no steady state,
# DualPipe's, DualPipeV's and combined 1F1B's overlapped pairs are not walked: the three counts
# or the whole.
REFUSED = {"gpipe", "zb-v", "dualpipe", "dualpipev", "combined-1f1b"}
DEPTHS = (2, 3, 4, 8)
LAYERS = 48
FEATURES = {**STEADY_FEATURES, "full recompute across nodes": {"tp": 8, "recompute": "full"}}


def raw_of(name: str, pp: int, v: int, m: int, cluster=None, **parallel) -> dict:
    p = {"schedule": name, "pp": pp, "virtual_stages": v, "tp": 1, "dp": 1, **parallel}
    return llama(m, model={"layers": LAYERS}, cluster=cluster, **p)


def valid(raw: dict) -> bool:
    try:
        build_scenario(raw)
    except Exception:  # noqa: BLE001 - a schedule refusing a feature or a depth
        return False
    return True


def long_enough(name: str, pp: int, v: int) -> int:
    """The smallest count on the schedule's grid at which ``periodic`` may walk a short run."""
    first, step = schedule_named(name).steady_from(pp)
    m = first
    while periodic.short_count(build_scenario(raw_of(name, pp, v, m))) is None:
        m += step
    return m


def shortcut_and_whole(raw: dict, profile=None):
    """(the step from one short walk or None, the whole simulation by SimPy) of ``raw``."""
    s = build_scenario(raw)
    extended = periodic.extended(s, lambda m: Engine(s, profile=profile, microbatches=m))
    whole = Engine(s, profile=profile).run()
    return (None if extended is None else Engine(s, profile=profile).result(extended)), whole


SHAPES = [(n, pp, v) for n, counts in CHUNKS.items() if n not in REFUSED for v in counts
          for pp in DEPTHS if LAYERS % (pp * v) == 0 and valid(raw_of(n, pp, v, 8 * pp))]
TAKEN = [(n, pp, v, f) for n, pp, v in SHAPES for f in FEATURES
         if (pp == 4 or f == "no data parallelism")
         and valid(raw_of(n, pp, v, 8 * pp, **FEATURES[f]))]


def test_every_registered_schedule_is_covered():
    assert set(CHUNKS) == set(SCHEDULES)


@pytest.mark.parametrize(("name", "pp", "v", "feature"), TAKEN)
def test_one_short_walk_extended_equals_the_whole_step(name, pp, v, feature):
    """At the first count the shortcut may be tried (where a walk that has not settled leaves
    no budget for a longer one: equal or refused), and at a larger one (taken, and equal):
    ZB-H1's upstream stages run ahead of the last one's cycle for about 2 pp micro-batches
    (they defer weight gradients), so its walks need room to settle: at 2 stages, with H100's
    GEMMs as shipped since 2026-11-29, more than 8 times the first count."""
    _, step = schedule_named(name).steady_from(pp)
    first = long_enough(name, pp, v)
    for m in (first, 16 * first if step == 1 else 2 * first):
        fast, whole = shortcut_and_whole(raw_of(name, pp, v, m, **FEATURES[feature]))
        assert fast is not None or m == first, m
        if fast is not None:
            assert_same(whole, fast)


@pytest.mark.parametrize(("name", "pp", "v"), [(n, pp, v) for n, pp, v in SHAPES if pp == 4])
def test_stragglers_and_compute_slowed_by_nccl_are_extended_exactly(name, pp, v):
    """Each stage its expected slowest GPU (unequal stages: the faster ones settle into the
    slowest one's cycle only after several units, ZB-H1's at 11 micro-batches), compute
    re-rated whenever a DP collective starts or ends beside it (the last units overlap the
    gradients' reduction: the latest units that repeat are used)."""
    profile = profile_for_gpu("h100-sxm").model_copy(update={"comm_compute_slowdown": 0.2})
    raw = raw_of(name, pp, v, 128, cluster=STRAGGLERS, dp=2, zero=1)
    fast, whole = shortcut_and_whole(raw, profile)
    assert fast is not None
    assert_same(whole, fast)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_other_schedules_are_refused_and_simulate_still_equals_the_whole(name):
    v = CHUNKS[name][0]
    s = build_scenario(raw_of(name, 4, v, 96))
    assert periodic.extended(s, lambda m: Engine(s, microbatches=m)) is None
    assert_same(Engine(s).run(), simulate(s))


def test_the_short_count_is_where_the_first_stage_holds_two_units_of_pairs():
    """Interleaved 1F1B: stage 0 warms up with ``2 (pp - 1) + (v - 1) pp`` forwards (Megatron-LM,
    ``interleaved.interleaved_1f1b``) and then runs one forward and one backward per step; one unit
    is ``pp`` micro-batches, ``pp v`` such pairs. Two units of pairs need ``v c`` forwards at
    least the warm-up plus ``2 pp v``: for Korthikanti et al.'s 530B (pp 35, v 3, m 280) that
    is c = 140, half the step."""
    for pp, v in ((4, 2), (8, 3), (35, 3), (64, 2)):
        need = (2 * (pp - 1) + (v - 1) * pp + 2 * pp * v) / v
        expected = max(3 * pp, pp * math.ceil(need / pp))  # from 2 pp + pp, on the grid of pp
        s = build_scenario({**raw_of("interleaved", pp, v, 8 * pp, tp=8),
                            "model": {"preset": "llama3-8b", "layers": pp * v, "seq_len": 2048}})
        assert periodic.short_count(s) == ((expected, pp) if expected <= 4 * pp else None)


def recording_engines(s):
    """(the counts walked, a function giving ``s``'s engine at a count and noting it)."""
    walked: list[int] = []

    def engine_at(m: int) -> Engine:
        walked.append(m)
        return Engine(s, microbatches=m)
    return walked, engine_at


def test_a_walk_whose_last_units_still_differ_is_refused():
    """1F1B on 8 stages, 18 micro-batches: the short count, 9, gives the first stage two
    forward-backward pairs, the first still in the warm-up's transient, so its two increments
    differ and the walk is refused; no longer walk fits half the step, so ``simulate`` runs it
    whole. With 96 micro-batches the shortcut walks one unit more, 10, which has settled."""
    s = build_scenario(raw_of("1f1b", 8, 1, 18, tp=8, recompute="full"))
    assert periodic.short_count(s) == (9, 1)
    assert periodic._periodic_walk(s, Engine(s, microbatches=9), 9, 1) is False
    assert periodic.extended(s, lambda m: Engine(s, microbatches=m)) is None
    assert_same(Engine(s).run(), simulate(s))
    s = build_scenario(raw_of("1f1b", 8, 1, 96, tp=8, recompute="full"))
    walked, engine_at = recording_engines(s)
    fast = periodic.extended(s, engine_at)
    assert walked == [10] and fast is not None
    assert_same(Engine(s).run(), Engine(s).result(fast))


def test_units_still_in_the_transient_would_extend_a_wrong_step():
    """Interleaved 1F1B on 8 stages of 3 chunks, walked at 48 micro-batches: the first unit of
    the first stage's repeating stretch still fills the pipeline (it takes longer than the
    next), so the increments of its first two units differ and the check refuses them, where
    extending the first would miss the whole step's finish by more than 1e-3; the last units
    agree, and the step extended from them is the whole one."""
    s = build_scenario(raw_of("interleaved", 8, 3, 96, tp=8, recompute="full"))
    engine = Engine(s, microbatches=48)
    marks = {}
    for r in engine.ranks:
        actions = engine.schedule[r.stage]
        unit = periodic._unit(actions, 48, 8)
        first, last = periodic._stretch(actions, unit, 8)
        marks[r.rid] = list(range(first, last + 1, unit))  # from the stretch's start
    totals, seen = walk.walked_marked(engine, marks)
    stage0 = seen[0]
    assert periodic._increment(stage0[:3]) is None
    naive = totals[0].finish + (96 - 48) // 8 * (stage0[1][0] - stage0[0][0])
    whole = Engine(s).run()
    assert abs(naive / whole.step_time_s - 1) > 1e-3
    assert periodic._increment(stage0[-3:]) is not None
    fast = periodic.extended(s, lambda m: Engine(s, microbatches=m))
    assert fast is not None
    assert_same(whole, Engine(s).result(fast))


def test_increments_that_change_are_refused():
    """States whose second difference is not zero (a quadratic clock) or whose activations
    held, or peak, still grow are not periodic."""
    fields = len(steady.Totals._fields) + 1  # and the activations held
    line = [tuple(float(3 * k + 1) for _ in range(fields)) for k in range(3)]
    flat = [tuple(x if i not in (periodic.PEAK, periodic.ACTIVATIONS_HELD) else 5.0
                  for i, x in enumerate(state)) for state in line]
    assert periodic._increment(flat) == tuple(3.0 if i != periodic.PEAK else 0.0
                                              for i in range(fields - 1))
    quadratic = [tuple(float(k * k) if i == 0 else x for i, x in enumerate(state))
                 for k, state in enumerate(flat)]
    assert periodic._increment(quadratic) is None
    assert periodic._increment(line) is None  # the peak and the activations held grow


def test_zb_v_declared_steady_drifts_late_and_is_refused_or_exact(monkeypatch):
    """ZB-V's breakdown drifts from m = 20 at pp 8 with full recomputation
    (``test_steady_schedules.test_zb_v_breakdown_drifts_after_three_counts_on_a_line``); as if
    its steady state were declared at 15, the walk's last units see the drift (or the walk
    refuses two sends at one instant): never a wrong step."""
    declared = replace(SCHEDULES["zb-v"], steady_from=lambda pp: (15, 1))
    monkeypatch.setitem(SCHEDULES, "zb-v", declared)
    s = build_scenario(raw_of("zb-v", 8, 2, 96, tp=2, recompute="full"))
    fast = periodic.extended(s, lambda m: Engine(s, microbatches=m))
    if fast is not None:
        assert_same(Engine(s).run(), Engine(s).result(fast))


def test_simulate_takes_one_walk_where_three_counts_cost_too_much():
    """Interleaved at m = 8 pp (Korthikanti et al.'s 175B: pp 8, v 3, m 64): the three counts
    (16, 24, 32) cost more than half the step, one walk of 32 does not."""
    s = build_scenario(raw_of("interleaved", 8, 3, 64, tp=8, recompute="full"))
    assert steady.sample_counts(s) is None
    assert periodic.short_count(s) == (32, 8)
    walked, engine_at = recording_engines(s)
    fast = periodic.extended(s, engine_at)
    assert walked == [32] and fast is not None
    assert_same(Engine(s).run(), simulate(s))


def test_simulate_takes_one_walk_where_it_costs_less_than_half_the_three_counts(monkeypatch):
    """1F1B on 8 stages, 96 micro-batches: the three counts are 8, 9, 10 (27 micro-batches);
    one walk of 10 costs less than half of them, so ``simulate`` walks it and never runs the
    three (the 1T case of Korthikanti et al.: one walk of 66 against 64 + 65 + 66)."""
    s = build_scenario(raw_of("1f1b", 8, 1, 96, tp=8, recompute="full"))
    assert steady.sample_counts(s) == (8, 9, 10)
    assert periodic.short_count(s) == (10, 1)

    def three_counts(*args):
        raise AssertionError("the three counts were run")

    monkeypatch.setattr(steady, "extrapolated", three_counts)
    assert_same(Engine(s).run(), simulate(s))
