"""The walk in arrays (``simulator/discrete_event/walk_rows.py``): where a step is one of fixed
durations, every rank's list at once gives the action-by-action walk's totals and noted states
(the oracle, itself held to the SimPy engine by ``test_steady_walk.py``) to float rounding;
where its durations are fixed up to some action, the arrays run that part and the walk the
rest (``walk_prefix.py``); anything else is refused and walked action by action."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from steady_helpers import llama
from test_steady_walk import CASES, FEATURES, raw_of

from clustersim.simulator.discrete_event import periodic, walk, walk_prefix, walk_rows
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from engine_speed import GPT_1T_INTERLEAVED, table5_cases  # noqa: E402

# Sums of 10^4-10^5 durations in another order than the walk's: this close, not to the bit.
ROUNDING = 1e-11
# Steps of fixed durations: no DP op during the pipeline (none, or reduced after it), whole
# backwards; the arrays run them (interleaved with tp_comm_overlap: a rank's activation and
# gradient arrive at once, and the gradient queues 12 us behind it, in rows as in the walk).
FIXED = {"no data parallelism", "ZeRO-0, reduction after the step",
         "tp 2, sequence parallel, tp_comm_overlap", "tp 8 across nodes, full recompute"}
# Fixed up to each chunk's last backward, which reduces its gradients over dp 2 beside it: the
# arrays run the rest, the walk from there.
FIXED_PART = {"ZeRO-1, gathers after the step", "MoE, expert parallel"}
ROW_SCHEDULES = {"gpipe", "1f1b", "interleaved"}  # the others split backwards or pair them


def assert_close(found, oracle) -> None:
    assert len(found) == len(oracle)
    for rank, (a, b) in enumerate(zip(found, oracle, strict=True)):
        for field, x, y in zip(range(len(b)), a, b, strict=True):
            assert math.isclose(x, y, rel_tol=ROUNDING, abs_tol=1e-12), (rank, field, x, y)


def marks_of(engine, count: int, step: int) -> dict[int, list[int]]:
    """The unit boundaries ``periodic.py`` notes states at."""
    shape = periodic._shape(engine, count, step)
    return {r.rid: periodic._marks(shape, r.stage, engine.schedule[r.stage], count, step) or []
            for r in engine.ranks}


@pytest.mark.parametrize(("name", "feature"), CASES)
def test_rows_equal_the_walk_or_are_refused(name, feature, monkeypatch):
    """Every case the walk takes, through the arrays as a long step would be (``ROWS_FROM``
    set to 0): all of it, its fixed part, or none (parameter gathers as the step starts, split
    backwards, per-micro-batch reductions)."""
    s = build_scenario(raw_of(name, feature))
    engine = Engine(s)
    found = walk_rows.row_totals(engine) if walk.walkable(engine) else None
    expected = (tuple if feature in FIXED else walk_rows.Prefix if feature in FIXED_PART
                else type(None)) if name in ROW_SCHEDULES else type(None)
    assert isinstance(found, expected)
    monkeypatch.setattr(walk, "ROWS_FROM", 0)
    oracle = walk.walked_totals(Engine(s), rows=False)
    if oracle is not None:
        assert_close(walk.walked_totals(Engine(s)), oracle)


@pytest.mark.parametrize("name", ["1f1b", "interleaved"])
def test_the_states_noted_at_unit_boundaries_are_the_walks(name):
    """What ``periodic.py`` extends a step from: each rank's clock, time by cause, peak and
    held activations before each repeating unit (GPipe's lists hold no repeating unit)."""
    s = build_scenario(raw_of(name, "tp 8 across nodes, full recompute", m=32))
    engine = Engine(s)
    marks = marks_of(engine, 32, 4 if name == "interleaved" else 1)
    rows = walk_rows.row_totals(engine, marks)
    oracle = walk.walked_marked(Engine(s), marks, rows=False)
    assert rows is not None and oracle is not None
    assert_close(rows[0], oracle[0])
    assert [len(states) for states in rows[1]] == [len(states) for states in oracle[1]]
    assert sum(map(len, rows[1])) >= 3 * len(engine.ranks) // 2  # most ranks noted several
    for found, expected in zip(rows[1], oracle[1], strict=True):
        for a, b in zip(found, expected, strict=True):
            assert_close([a], [b])


@pytest.mark.parametrize("raw", [c[0] for c in table5_cases()[:8]],
                         ids=[c[0]["name"] for c in table5_cases()[:8]])
def test_korthikanti_table5_runs_in_rows(raw):
    """Korthikanti et al. 2022, Table 5, at two pipelines' worth of micro-batches (the walk
    of the whole 530B and 1T steps takes seconds): dp 1, nothing on the DP stream."""
    s = build_scenario(raw)
    m = min(s.microbatches, 2 * s.parallel.pp)
    rows = walk_rows.row_totals(Engine(s, microbatches=m))
    assert rows is not None
    assert_close(rows[0], walk.walked_totals(Engine(s, microbatches=m), rows=False))


@pytest.mark.parametrize("raw", [c[0] for c in table5_cases()[2:6]],
                         ids=[c[0]["name"] for c in table5_cases()[2:6]])
def test_korthikanti_interleaved_runs_with_asynchronous_sends_run_in_rows(raw):
    """The 175B and 530B runs (interleaved) as today's Megatron-LM would send: each message
    arriving past its sender's wait, the sends into a rank queueing, in rows as in the walk."""
    s = build_scenario({**raw, "parallel": {**raw["parallel"], "overlap_p2p_comm": True}})
    m = min(s.microbatches, 2 * s.parallel.pp)
    rows = walk_rows.row_totals(Engine(s, microbatches=m))
    assert rows is not None
    assert_close(rows[0], walk.walked_totals(Engine(s, microbatches=m), rows=False))


def test_messages_that_queue_into_a_rank_queue_as_in_the_walk():
    """A pipeline whose messages take longer than its compute (a small model over a slow
    network, one stage a node): a rank's activation and gradient arrive at once and the one
    called later waits for the other, its sender blocked (exposed pp time, not bubble)."""
    raw = llama(8, tp=1, dp=1, pp=4, schedule="1f1b",
                cluster={"gpus_per_node": 1, "inter_node": {"bandwidth": 0.05}})
    s = build_scenario(raw)
    rows = walk_rows.row_totals(Engine(s))
    oracle = walk.walked_totals(Engine(s), rows=False)
    assert isinstance(rows, tuple) and oracle is not None
    assert_close(rows[0], oracle)
    assert max(t.pp for t in oracle) > 0.5 * max(t.finish for t in oracle)  # sends dominate


def test_parameters_gathered_as_the_step_starts_are_left_to_the_walk():
    """ZeRO-1 with ``overlap_param_gather`` gathers every chunk's parameters on the DP stream
    as the step starts: the first forwards wait for them and compute slows beside them, so no
    part of the step has fixed durations."""
    s = build_scenario(raw_of("1f1b", "ZeRO-1, reduction and gathers beside compute slowed by "
                                      "NCCL"))
    assert "dp" in FEATURES["ZeRO-1, reduction and gathers beside compute slowed by NCCL"]
    assert walk_rows.row_totals(Engine(s)) is None


def test_the_1t_interleaved_step_runs_in_rows_up_to_its_last_backwards():
    """Narayanan et al.'s 1T model interleaved on 64 stages over 6 replicas (ZeRO-0): each
    chunk's last backward all-reduces its gradients beside it, so the arrays run each rank up
    to there (about 88% of its list) and the walk the rest, to the walk's answer."""
    s = build_scenario(GPT_1T_INTERLEAVED)
    found = walk_rows.row_totals(Engine(s, microbatches=128))
    assert isinstance(found, walk_rows.Prefix)
    assert 0.8 < sum(r.i for r in found.ranks) / sum(len(r.actions) for r in found.ranks) < 1
    assert_close(walk.walked_totals(Engine(s, microbatches=128)),
                 walk.walked_totals(Engine(s, microbatches=128), rows=False))


def test_a_long_step_is_walked_in_rows_and_a_short_one_action_by_action(monkeypatch):
    """Korthikanti et al.'s 1T model on 64 stages at 128 micro-batches (about 33,000 actions)
    goes through the arrays, to the walk's answer; its 22B model (no pipeline) is walked, as
    importing numpy would cost more than walking it."""
    taken = []
    rows = walk_rows.row_totals
    monkeypatch.setattr(walk_rows, "row_totals",
                        lambda engine, marks=None: taken.append(engine) or rows(engine, marks))
    long_step, short_step = (build_scenario(c[0]) for c in table5_cases()[6::-6])
    engine = Engine(long_step, microbatches=128)
    assert sum(len(engine.schedule[r.stage]) for r in engine.ranks) >= walk.ROWS_FROM
    assert_close(walk.walked_totals(engine),
                 walk.walked_totals(Engine(long_step, microbatches=128), rows=False))
    assert walk.walked_totals(Engine(short_step)) is not None
    assert taken == [engine]


def test_a_send_of_the_walks_that_overlaps_one_of_the_fixed_parts_is_a_clash():
    """The sends into a rank in the fixed part are disjoint spans; one of the walk's that
    overlaps any of them (the walk would have queued one behind the other) sends the step back
    to the walk; spans that only touch, or go into another rank, do not."""
    prefix = walk_prefix.Prefix([], {}, {3: (np.array([0.0, 2.0]), np.array([1.0, 3.0]))})
    assert walk_prefix.clashes(prefix, [(3, 0.5, 0.7)])
    assert walk_prefix.clashes(prefix, [(3, 2.9, 4.0)])
    assert walk_prefix.clashes(prefix, [(3, -1.0, 0.1)])
    assert not walk_prefix.clashes(prefix, [(3, 1.0, 2.0), (3, 3.0, 5.0), (4, 0.0, 9.0)])


@pytest.mark.parametrize("name", sorted(ROW_SCHEDULES))
def test_a_fixed_part_with_queued_sends_over_a_slow_network(name, monkeypatch):
    """ZeRO-1 over two replicas, its gradients reduced beside each chunk's last backward, one
    stage a node over 50 MB/s links, blocking sends: the arrays queue the sends of the fixed
    part, the walk goes on from it, and the step is the walk's. (Asynchronous sends over such
    links queue behind their own rank's sends, a chain a sweep lengthens by one: the arrays
    give up and the walk takes the step, as ``test_asynchronous_sends_...`` checks.)"""
    raw = llama(8, tp=1, dp=2, pp=4, schedule=name, zero=1, overlap_param_gather=False,
                virtual_stages=2 if name == "interleaved" else 1, overlap_p2p_comm=False,
                cluster={"gpus_per_node": 1, "inter_node": {"bandwidth": 0.05}})
    s = build_scenario(raw)
    assert isinstance(walk_rows.row_totals(Engine(s)), walk_rows.Prefix)
    monkeypatch.setattr(walk, "ROWS_FROM", 0)
    assert_close(walk.walked_totals(Engine(s)), walk.walked_totals(Engine(s), rows=False))


@pytest.mark.parametrize("name", sorted(ROW_SCHEDULES))
def test_asynchronous_sends_run_in_rows_as_in_the_walk(name):
    """``overlap_p2p_comm``: a sender waits only a fraction of its transfer, its message
    arriving when the transfer ends; the arrays carry each message's lag past its send and
    give the walk's totals."""
    raw = llama(8, tp=2, dp=1, pp=4, schedule=name, overlap_p2p_comm=True,
                virtual_stages=2 if name == "interleaved" else 1)
    s = build_scenario(raw)
    rows = walk_rows.row_totals(Engine(s))
    oracle = walk.walked_totals(Engine(s), rows=False)
    assert isinstance(rows, tuple) and oracle is not None
    assert_close(rows[0], oracle)


def test_asynchronous_sends_over_a_slow_network_are_the_walks_whichever_path():
    """Over 50 MB/s links a rank's sends queue behind its own earlier ones: whether the arrays
    settle or leave the step to the walk, the totals are the walk's."""
    raw = llama(8, tp=1, dp=1, pp=4, schedule="interleaved", virtual_stages=2,
                overlap_p2p_comm=True,
                cluster={"gpus_per_node": 1, "inter_node": {"bandwidth": 0.05}})
    s = build_scenario(raw)
    oracle = walk.walked_totals(Engine(s), rows=False)
    found = walk_rows.row_totals(Engine(s))
    assert oracle is not None
    if found is not None:
        assert_close(found[0], oracle)
