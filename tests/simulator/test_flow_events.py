"""The event-driven flow network's shortcuts (issue 26, item 3) against a plain fluid
simulation written here: every flow's rate recomputed over every active flow at every start
and end by the textbook water-filling, with no components, no flow-alone shortcut, no bundles
and no delayed starts. Random flows on a few links, some alone on idle links (the shortcut
that gives a flow its rate at once), some joining them later, some started ``after`` a delay,
some in bundles done when their last flow is."""

from __future__ import annotations

import random

import pytest
import simpy
from test_fabric_filling import water_fill

from clustersim.simulator.network.flows import FlowNetwork


def plain_fluid(starts: list[float], paths: list[list[str]], sizes: list[float],
                capacity: dict[str, float]) -> list[float]:
    """Each flow's end: from one event (a start or an end) to the next, every active flow
    moves at its water-filling rate over all active flows."""
    n = len(paths)
    left, ends = list(sizes), [None] * n
    now = 0.0
    while any(e is None for e in ends):
        active = [i for i in range(n) if ends[i] is None and starts[i] <= now]
        rates = dict(zip(active, water_fill([paths[i] for i in active], capacity),
                         strict=True)) if active else {}
        waiting = [starts[i] for i in range(n) if starts[i] > now]
        finish = [now + left[i] / rates[i] for i in active]
        step = min(waiting + finish) - now
        for i in active:
            left[i] -= rates[i] * step
        now += step
        for i in active:
            if left[i] <= 1e-9 * sizes[i]:
                ends[i] = now
    return ends


def random_flows(seed: int):
    """Up to 6 links, up to 24 flows over 1-3 of them, starting at one of a few instants
    (so some start together and some alone), grouped into bundles of 1-3."""
    rng = random.Random(seed)
    links = [f"L{i}" for i in range(rng.randint(2, 6))]
    capacity = {link: rng.uniform(1.0, 10.0) for link in links}
    n = rng.randint(2, 24)
    paths = [rng.sample(links, rng.randint(1, min(3, len(links)))) for _ in range(n)]
    starts = [rng.choice([0.0, 0.5, 1.0, 2.5, 4.0]) for _ in range(n)]
    sizes = [rng.uniform(1.0, 20.0) for _ in range(n)]
    bundles, i = [], 0
    while i < n:  # consecutive flows of one start, up to 3
        j = i + 1
        while j < min(n, i + rng.randint(1, 3)) and starts[j] == starts[i]:
            j += 1
        bundles.append(list(range(i, j)))
        i = j
    return capacity, paths, starts, sizes, bundles, rng


def network_ends(capacity, paths, starts, sizes, bundles, rng) -> dict[int, float]:
    """When each bundle is done on ``FlowNetwork``: single flows by ``transfer``, half of them
    started by ``after`` rather than a process's own timeout; bundles by ``bundle``."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    for link, bandwidth in capacity.items():
        net.add_link(link, bandwidth)
    done: dict[int, float] = {}

    def run(k, members, delayed):
        start = starts[members[0]]
        if len(members) == 1 and delayed:
            yield net.transfer(paths[members[0]], sizes[members[0]], after=start)
        else:
            yield env.timeout(start)
            if len(members) == 1:
                yield net.transfer(paths[members[0]], sizes[members[0]])
            else:
                yield net.bundle([(paths[j], sizes[j]) for j in members])
        done[k] = env.now

    for k, members in enumerate(bundles):
        env.process(run(k, members, rng.random() < 0.5))
    env.run()
    return done


@pytest.mark.parametrize("seed", range(40))
def test_the_network_ends_flows_when_a_plain_fluid_simulation_does(seed):
    capacity, paths, starts, sizes, bundles, rng = random_flows(seed)
    ends = plain_fluid(starts, paths, sizes, capacity)
    done = network_ends(capacity, paths, starts, sizes, bundles, rng)
    for k, members in enumerate(bundles):
        assert done[k] == pytest.approx(max(ends[j] for j in members), rel=1e-9)


def test_a_flow_alone_on_idle_links_is_re_rated_when_another_joins_at_once():
    """The shortcut gives the first flow its link's whole rate; a second flow starting at the
    same instant on the same link halves both (each 10 B at 1 B/s shared: done at 20 s)."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    net.add_link("a", 1.0)
    first, second = net.transfer(["a"], 10.0), net.transfer(["a"], 10.0)
    env.run()
    assert first.processed and second.processed and env.now == pytest.approx(20.0)


def test_an_alarm_armed_an_ulp_early_still_wakes_the_network_for_the_next_end():
    """An end armed at a later instant than it was computed at fires at ``now + (end - now)``,
    which can lie an ulp before the end (these figures, from an all-to-all over 32 A100s):
    the network must take it for its own alarm and arm the next, or the flows still running
    never end (the last transfer here, 0.02 B at 1 B/s from 0.000155 s, ends at 0.020155 s)."""
    since, first_end, end = 0.000155, 0.0013807326757990868, 0.009593006928896563
    assert first_end + (end - first_end) != end  # the ulp
    env = simpy.Environment()
    net = FlowNetwork(env)
    for link in "abc":
        net.add_link(link, 1.0)
    done = {}

    def run():
        yield env.timeout(since)
        early = net.transfer(["b"], first_end - since)
        middle = net.transfer(["a"], end - since)  # armed only once ``early`` ends
        last = net.transfer(["c"], 0.02)
        yield early & middle
        yield last
        done["last"] = env.now

    env.process(run())
    env.run()
    assert done["last"] == pytest.approx(since + 0.02, rel=1e-12)
