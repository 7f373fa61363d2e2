"""Engines report how many of their ranks' actions have run, to a listener only when asked."""

from __future__ import annotations

from sim_helpers import flat_profile, scenario

from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.discrete_event.progress import current, listening


def test_an_engine_reports_its_actions_to_the_listener_and_to_no_one_otherwise():
    s = scenario(layers=8, micro_batches=64, pp=4)
    seen: list[tuple[int, int]] = []
    with listening(lambda done, total: seen.append((done, total))):
        engine = Engine(s, profile=flat_profile())
        engine.run()
    assert current() is None
    total = sum(len(actions) for actions in engine.schedule.values())
    assert seen and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1][0] <= total
    assert engine.ran == total
