"""Max-min fair flows over multi-hop paths: hand-computable oracles."""

from __future__ import annotations

import pytest
import simpy

from clustersim.simulator.network.flows import FlowNetwork, max_min_rates


def test_max_min_gives_the_unused_share_to_who_can_use_it():
    """Bertsekas & Gallager's textbook case: A (1) carries f1 and f2, B (2) carries f2 and f3.
    A splits evenly (0.5, 0.5); f2 is frozen by A, so f3 takes all B has left, 1.5."""
    rates = max_min_rates([["A"], ["A", "B"], ["B"]], {"A": 1.0, "B": 2.0})
    assert rates == pytest.approx([0.5, 0.5, 1.5])


def run(links: dict, flows: list[tuple[float, list, float]]) -> list[float]:
    """Start each (time, path, bytes) flow; when each one ends."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    for link, bandwidth in links.items():
        net.add_link(link, bandwidth)
    ends = [0.0] * len(flows)

    def one(i, start, path, nbytes):
        yield env.timeout(start)
        yield net.transfer(path, nbytes)
        ends[i] = env.now

    for i, (start, path, nbytes) in enumerate(flows):
        env.process(one(i, start, path, nbytes))
    env.run()
    return ends


def test_two_flows_through_one_port_take_twice_as_long():
    alone = run({"out0": 10.0, "in1": 10.0}, [(0, ["out0", "in1"], 100)])
    both = run({"out0": 10.0, "in1": 10.0, "out2": 10.0},
               [(0, ["out0", "in1"], 100), (0, ["out2", "in1"], 100)])  # both into GPU 1
    assert alone == pytest.approx([10.0])
    assert both == pytest.approx([20.0, 20.0])


def test_incast_of_n_senders_divides_the_receivers_port():
    n = 7
    links = {"in": 10.0, **{f"out{i}": 10.0 for i in range(n)}}
    ends = run(links, [(0, [f"out{i}", "in"], 100) for i in range(n)])
    assert ends == pytest.approx([10.0 * n] * n)


def test_a_late_flow_slows_the_first_only_while_both_run():
    """f1 (100 B) alone at 10 B/s for 4 s (60 B left); f2 (20 B) joins: 5 B/s each, f2 ends
    at 8 s with f1 at 40 B left, which then takes 4 s more: 12 s."""
    ends = run({"L": 10.0}, [(0, ["L"], 100), (4, ["L"], 20)])
    assert ends == pytest.approx([12.0, 8.0])


def test_a_flow_bottlenecked_elsewhere_leaves_its_share_on_the_shared_link():
    """f1 crosses a slow link (2 B/s) and the shared one; f2 only the shared one (10 B/s): f2
    runs at 8, not 5."""
    ends = run({"slow": 2.0, "shared": 10.0}, [(0, ["slow", "shared"], 20), (0, ["shared"], 80)])
    assert ends == pytest.approx([10.0, 10.0])


def test_bytes_carried_per_link():
    env = simpy.Environment()
    net = FlowNetwork(env)
    net.add_link("a", 1.0)
    net.add_link("b", 1.0)
    net.transfer(["a", "b"], 5)
    net.transfer(["b"], 3)
    env.run()
    assert net.carried == {"a": 5, "b": 8}


def test_bad_bandwidth_is_refused():
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        FlowNetwork(simpy.Environment()).add_link("x", 0.0)
