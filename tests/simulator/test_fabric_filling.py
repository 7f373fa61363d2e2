"""Max-min fair rates (issue 26, item 3): the heap and the numpy progressive filling against a
plain water-filling written here, and against the definition of max-min fairness itself, on
small random networks; and the network's batching of an instant's changes."""

from __future__ import annotations

import random

import pytest
import simpy

from clustersim.simulator.network import flows
from clustersim.simulator.network.flows import FlowNetwork, heap_rates, vector_rates

FILLINGS = {"heap": heap_rates, "vector": vector_rates}


def water_fill(paths: list[list[str]], capacity: dict[str, float]) -> list[float]:
    """The textbook procedure, step by step (Bertsekas & Gallager, "Data Networks", sec.
    6.5.2): raise every unfrozen flow by the smallest increment that fills some link, then
    freeze the flows crossing a full link; until every flow is frozen."""
    n = len(paths)
    rates, frozen = [0.0] * n, [False] * n
    links = {link for path in paths for link in path}
    while not all(frozen):
        def used(link):
            return sum(rates[i] for i in range(n) if link in paths[i])

        def rising(link):
            return sum(1 for i in range(n) if link in paths[i] and not frozen[i])

        step = min((capacity[link] - used(link)) / rising(link) for link in links
                   if rising(link))
        for i in range(n):
            if not frozen[i]:
                rates[i] += step
        for link in links:
            if capacity[link] - used(link) <= 1e-9 * capacity[link]:
                for i in range(n):
                    if link in paths[i]:
                        frozen[i] = True
    return rates


def random_network(seed: int) -> tuple[list[list[str]], dict[str, float]]:
    """Up to 8 links of 1-10 B/s and up to 60 flows over 1-4 of them (some repeated)."""
    rng = random.Random(seed)
    links = [f"L{i}" for i in range(rng.randint(1, 8))]
    capacity = {link: rng.uniform(1.0, 10.0) for link in links}
    paths = [[rng.choice(links) for _ in range(rng.randint(1, 4))]
             for _ in range(rng.randint(1, 60))]
    return paths, capacity


@pytest.mark.parametrize("filling", FILLINGS)
@pytest.mark.parametrize("seed", range(60))
def test_fillings_equal_the_textbook_water_filling(filling, seed):
    paths, capacity = random_network(seed)
    assert FILLINGS[filling](paths, capacity) == pytest.approx(water_fill(paths, capacity),
                                                               rel=1e-9)


@pytest.mark.parametrize("filling", FILLINGS)
@pytest.mark.parametrize("seed", range(60, 90))
def test_every_flow_has_a_bottleneck(filling, seed):
    """The definition (Bertsekas & Gallager, prop. 6.5.1): rates are max-min fair iff no link
    is over its capacity and every flow crosses a full link on which no flow is faster."""
    paths, capacity = random_network(seed)
    rates = FILLINGS[filling](paths, capacity)
    load = {link: sum(r for r, p in zip(rates, paths, strict=True) if link in p)
            for link in capacity}
    assert all(load[link] <= capacity[link] * (1 + 1e-9) for link in capacity)
    for rate, path in zip(rates, paths, strict=True):
        assert any(load[link] >= capacity[link] * (1 - 1e-9)
                   and all(r <= rate * (1 + 1e-9) for r, p in zip(rates, paths, strict=True)
                           if link in p)
                   for link in path)


@pytest.mark.parametrize("filling", FILLINGS)
def test_the_textbook_three_flows(filling):
    """A (1 B/s) carries f1 and f2, B (2 B/s) f2 and f3: A splits evenly (0.5, 0.5); f2 is
    frozen by A, so f3 takes all B has left, 1.5 (Bertsekas & Gallager's example)."""
    rates = FILLINGS[filling]([["A"], ["A", "B"], ["B"]], {"A": 1.0, "B": 2.0})
    assert rates == pytest.approx([0.5, 0.5, 1.5])


def test_large_components_take_the_vector_filling(monkeypatch):
    calls = []
    monkeypatch.setattr(flows, "vector_rates", lambda p, c: calls.append(len(p)) or [])
    flows.max_min_rates([["a"]] * flows.VECTOR_FLOWS, {"a": 1.0})
    flows.max_min_rates([["a"]] * (flows.VECTOR_FLOWS - 1), {"a": 1.0})
    assert calls == [flows.VECTOR_FLOWS]


def test_an_instants_starts_and_ends_rerate_once(monkeypatch):
    """A ring of 6 flows through one switch link of 3 B/s, started by 6 processes at one
    instant: filled once when they start (0.5 B/s each), and not again when they all end
    together; each ends at 1 s + 6 B / (0.5 B/s)."""
    calls = []
    real = flows.max_min_rates
    monkeypatch.setattr(flows, "max_min_rates", lambda p, c: calls.append(len(p)) or real(p, c))
    env = simpy.Environment()
    net = FlowNetwork(env)
    net.add_link("switch", 3.0)
    for i in range(6):
        net.add_link(("out", i), 1.0)
        net.add_link(("in", i), 1.0)
    ends = []

    def send(i):
        yield env.timeout(1.0)
        yield net.transfer([("out", i), "switch", ("in", (i + 1) % 6)], 6.0)
        ends.append(env.now)

    for i in range(6):
        env.process(send(i))
    env.run()
    assert ends == pytest.approx([13.0] * 6)
    assert calls == [6]  # the ends free every link: nothing is left to re-rate


def test_a_flow_alone_on_its_links_runs_at_the_slowest_without_filling(monkeypatch):
    monkeypatch.setattr(flows, "max_min_rates", lambda p, c: pytest.fail("filled"))
    env = simpy.Environment()
    net = FlowNetwork(env)
    net.add_link("out", 4.0)
    net.add_link("in", 2.0)
    net.transfer(["out", "in"], 10.0)
    env.run()
    assert env.now == pytest.approx(5.0)


def test_a_bundle_ends_with_its_slowest_flow():
    """Two mirror flows of 10 B, one alone on a 10 B/s link, one sharing a 10 B/s link with a
    third flow of 10 B: the first is through at 1 s, the other at 2 s, so the bundle at 2 s."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    net.add_link("fast", 10.0)
    net.add_link("shared", 10.0)
    done = {}

    def watch(name, event):
        yield event
        done[name] = env.now

    env.process(watch("bundle", net.transfer_all([["fast"], ["shared"]], 10.0)))
    env.process(watch("other", net.transfer(["shared"], 10.0)))
    env.run()
    assert done == pytest.approx({"bundle": 2.0, "other": 2.0})
