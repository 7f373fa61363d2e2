"""The memory model walks a schedule's lists at ``repeating_count``, not at every count: the
answers must be the whole lists' own.

Oracle: each rank's whole action list for ``m`` micro-batches, walked here action by action
(what each chunk holds at the first peak, and every state passed through), against what the
memory model reads at the shorter count (``PipelineSchedule.held`` and the split backward's
states, ``split_backward._held_states``).
"""

from __future__ import annotations

import pytest

from clustersim.simulator.costs import split_backward
from clustersim.simulator.pipeline.list_schedule import repeating_count
from clustersim.simulator.pipeline.schedules import SCHEDULES, Kind, schedule_named

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741
WALKED = ("zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev", "1f1b", "interleaved")


def _chunks_per_rank(name: str) -> tuple[int, ...]:
    s = schedule_named(name)
    if s.chunk_counts:
        return s.chunk_counts
    return (2, 3) if s.chunks_per_rank else (1,)


def _whole_list_peak(actions) -> list[int]:
    """Micro-batches each chunk holds (forward run, weight gradient not yet) the first time
    the rank holds the most."""
    chunks = sorted({a.chunk for a in actions if a.kind is not Kind.OVERLAP_F_B})
    live = dict.fromkeys(chunks, 0)
    best, peak = [0] * len(chunks), -1
    for a in actions:
        if a.kind is F:
            live[a.chunk] += 1
        elif a.kind in (B, W):
            live[a.chunk] -= 1
        if a.kind is F and sum(live.values()) > peak:
            peak, best = sum(live.values()), [live[c] for c in chunks]
    return best


def _cases():
    for name in WALKED:
        for v in _chunks_per_rank(name):
            for pp in (1, 2, 3, 4, 6):
                first, step = schedule_named(name).list_growth(pp)
                base = first + step
                yield name, v, pp, [2 * base + k * step for k in (1, 2, 5)]


@pytest.mark.parametrize("name,v,pp,counts", list(_cases()))
def test_the_shorter_lists_hold_what_the_whole_lists_hold(name, v, pp, counts):
    schedule = schedule_named(name)
    for m in counts:
        try:
            whole = schedule.build(pp, m, v)
        except ValueError:
            continue
        for stage, actions in whole.items():
            assert schedule.held(pp, m, v, stage) == _whole_list_peak(actions), (m, stage)
        short = repeating_count(name, pp, m, v)
        assert short <= m
        if split_backward.splits_backward(name):
            for (chunks, held, halves), (c2, h2, w2) in zip(
                    split_backward._held_states(name, pp, m, v),
                    split_backward._held_states(name, pp, short, v), strict=True):
                assert chunks == c2
                assert (held is None) == (h2 is None)
                if held is not None:
                    assert held.tolist() == h2.tolist() and halves.tolist() == w2.tolist()


def test_long_lists_are_walked_short():
    """Where a schedule repeats a unit, a long step's memory is read off a few units."""
    for name in ("zb-h1", "zb-h2", "zb-v", "dualpipev", "1f1b"):
        first, step = schedule_named(name).list_growth(4)
        v = 2 if name in ("zb-v", "dualpipev") else 1
        assert repeating_count(name, 4, 512, v) == first + step


def test_gpipe_is_walked_whole():
    """GPipe's forwards and backwards grow apart: each count holds more, so none is
    shortened."""
    assert "gpipe" in SCHEDULES
    assert repeating_count("gpipe", 4, 64, 1) == 64
