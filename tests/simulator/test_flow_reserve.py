"""A reserved flow (``FlowNetwork.reserve``, a tensor-parallel ring's port) is one timer while its
links carry nothing else, and the flow it stands for as soon as another flow comes onto them
(issue 26, item 3). Checked against hand-worked max-min fluid figures, against the plain fluid
simulation of ``test_flow_events`` on random networks, and in the engine against the same
scenario with every reservation run as a plain ``transfer``, where a data-parallel ring shares
the NVLink ports (the reservations fall back) and where the tensor-parallel group owns them."""

from __future__ import annotations

import copy

import pytest
import simpy
from test_flow_events import plain_fluid, random_flows

from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.network.flows import FlowNetwork


def _network(capacity: dict[str, float]) -> tuple[simpy.Environment, FlowNetwork]:
    env = simpy.Environment()
    net = FlowNetwork(env)
    for link, bandwidth in capacity.items():
        net.add_link(link, bandwidth)
    return env, net


def _ring_and_other(how: str, other_path: list[str], other_at: float, after: float = 0.0):
    """A 100 B ring over a 10 B/s port (both ways) from ``after``, run by ``how`` ("reserve",
    "reserve at once" or "transfer"), and a 40 B flow along ``other_path`` from ``other_at``:
    both ends, and how many events SimPy processed."""
    env, net = _network({"out": 10.0, "in": 10.0, "nic": 100.0, "elsewhere": 10.0})
    ends: dict[str, float] = {}

    def ring():
        if how == "reserve at once":  # the timer itself, its waiter moved on a release
            yield net.reserve(["out", "in"], 100.0, after, at_once=True)
        else:
            yield getattr(net, how)(["out", "in"], 100.0, after)
        ends["ring"] = env.now

    def other():
        yield env.timeout(other_at)
        yield net.transfer(other_path, 40.0)
        ends["other"] = env.now

    env.process(ring())
    env.process(other())
    events = 0
    while env.peek() < float("inf"):
        env.step()
        events += 1
    return ends, events


@pytest.mark.parametrize("how", ["reserve", "reserve at once", "transfer"])
def test_a_flow_sharing_the_port_mid_run_slows_the_ring_as_max_min_says(how):
    """From 2 s the two share ``out`` at 5 B/s each: the 40 B flow ends at 2 + 40/5 = 10 s with
    the ring 80 - 40 = 40 B short, which it sends alone at 10 B/s: 14 s, not its closed form's
    10 s (a shortcut taken regardless would say 10)."""
    ends, _ = _ring_and_other(how, ["out", "nic"], 2.0)
    assert ends["ring"] == pytest.approx(14.0, rel=1e-12)
    assert ends["other"] == pytest.approx(10.0, rel=1e-12)


@pytest.mark.parametrize("how", ["reserve", "reserve at once", "transfer"])
def test_a_flow_arriving_during_the_rings_alphas_shares_the_port_from_its_start(how):
    """The ring starts at 1 s, the other flow at 0.5 s on ``out`` (alone at 10 B/s until 1 s:
    35 B left); then 5 B/s each: the other ends at 1 + 35/5 = 8 s, the ring has 100 - 35 = 65 B
    left and ends at 8 + 65/10 = 14.5 s."""
    ends, _ = _ring_and_other(how, ["out", "nic"], 0.5, after=1.0)
    assert ends["other"] == pytest.approx(8.0, rel=1e-12)
    assert ends["ring"] == pytest.approx(14.5, rel=1e-12)


def test_a_reserved_ring_on_ports_nothing_else_crosses_is_one_timer_at_its_closed_form():
    """Alone on its port the ring takes 0.5 s of alphas then 100 B / 10 B/s: 10.5 s, whichever
    way it runs; reserved, SimPy processes fewer events (no start, alarm or settling)."""
    reserved, few = _ring_and_other("reserve", ["elsewhere"], 2.0, after=0.5)
    plain, more = _ring_and_other("transfer", ["elsewhere"], 2.0, after=0.5)
    assert reserved["ring"] == plain["ring"] == 10.5
    assert reserved["other"] == plain["other"] == 6.0
    assert few < more


def test_a_wait_begun_after_a_release_waits_for_the_flows_end():
    """An ``at_once`` reservation waited for only at 5 s, after a 40 B flow took its port back
    at 2 s: ``current`` gives the flow's end, 14 s (the hand-worked figures above), not the
    timer's 10 s."""
    env, net = _network({"out": 10.0, "in": 10.0, "nic": 100.0})
    ends = {}

    def ring():
        event = net.reserve(["out", "in"], 100.0, at_once=True)
        yield env.timeout(5.0)
        yield net.current(event)
        ends["ring"] = env.now

    def other():
        yield env.timeout(2.0)
        yield net.transfer(["out", "nic"], 40.0)

    env.process(ring())
    env.process(other())
    env.run()
    assert ends["ring"] == pytest.approx(14.0, rel=1e-12)


def test_a_second_reservation_on_a_reserved_port_runs_both_as_flows():
    """Two 10 B rings on one 1 B/s port, both from 0: they share it, 0.5 B/s each, both end at
    20 s (the second reservation finds the port taken and releases the first)."""
    env, net = _network({"port": 1.0})
    ends = []

    def ring():
        yield net.reserve(["port"], 10.0)
        ends.append(env.now)

    env.process(ring())
    env.process(ring())
    env.run()
    assert ends == pytest.approx([20.0, 20.0], rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_reserved_flows_end_when_a_plain_fluid_simulation_ends_them(seed):
    """``test_flow_events``' random networks, each single flow reserved: every end equals the
    textbook water-filling's, whichever flows come onto a reservation's links and when."""
    capacity, paths, starts, sizes, bundles, _ = random_flows(seed)
    ends = plain_fluid(starts, paths, sizes, capacity)
    env, net = _network(capacity)
    done: dict[int, float] = {}

    def run(k, members):
        if len(members) == 1:
            yield net.reserve(paths[members[0]], sizes[members[0]], after=starts[members[0]])
        else:
            yield env.timeout(starts[members[0]])
            yield net.bundle([(paths[j], sizes[j]) for j in members])
        done[k] = env.now

    for k, members in enumerate(bundles):
        env.process(run(k, members))
    env.run()
    for k, members in enumerate(bundles):
        assert done[k] == pytest.approx(max(ends[j] for j in members), rel=1e-9)


# --- in the engine: against the same step with every reservation a plain transfer -----------

_SMALL = {
    "name": "reserve-check",
    "model": {"preset": "llama3-8b", "seq_len": 2048, "layers": 4},
    "cluster": {"preset": "dgx-h100", "gpus": 32,
                "inter_node": {"bandwidth": 50, "latency": 5.0e-6, "kind": "infiniband-ndr",
                               "topology": "fat-tree", "oversubscription": 2.0,
                               "leaf_ports": 16, "spines": 2}},
    "training": {"global_batch": 16},
    "parallel": {"tp": 8, "pp": 2, "dp": 2, "zero": 1, "sequence_parallel": True},
}


def _steps(raw: dict, monkeypatch) -> tuple[list, list, int]:
    """Every rank's totals with reservations, the same with each one a plain ``transfer``,
    and how many reservations another flow took back."""
    released = []
    release = FlowNetwork._release
    monkeypatch.setattr(FlowNetwork, "_release",
                        lambda net, held: (released.append(held), release(net, held)))
    reserved = Engine(build_scenario(raw), "full").totals()
    monkeypatch.setattr(FlowNetwork, "reserve", lambda net, path, nbytes, after=0.0, at_once=False:
                        FlowNetwork.transfer(net, path, nbytes, after))
    plain = Engine(build_scenario(raw), "full").totals()
    return reserved, plain, len(released)


def _assert_same(reserved: list, plain: list) -> None:
    for a, b in zip(reserved, plain, strict=True):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_a_tensor_parallel_group_owning_its_ports_keeps_every_reservation(monkeypatch):
    """tp 8 fills each node: data-parallel and pipeline peers are in other nodes, so nothing
    but the group's rings crosses an NVLink port; under ECMP every GPU is simulated."""
    reserved, plain, released = _steps(_SMALL, monkeypatch)
    _assert_same(reserved, plain)
    assert released == 0


def test_a_data_parallel_ring_through_the_ports_takes_reservations_back(monkeypatch):
    """tp 2: the data-parallel replicas 2 GPUs apart share a node, so their ring's flows cross
    the NVLink ports the tensor-parallel rings reserved, and the step is the flow network's."""
    raw = copy.deepcopy(_SMALL)
    raw["parallel"].update(tp=2, dp=8)
    reserved, plain, released = _steps(raw, monkeypatch)
    _assert_same(reserved, plain)
    assert released > 0


def test_a_full_step_leaves_the_collectors_thresholds_as_it_found_them():
    """A full-fidelity step collects young objects less often while it runs (``engine.
    YOUNG_COLLECTION``), and puts CPython's thresholds back after."""
    import gc

    before = gc.get_threshold()
    Engine(build_scenario(_SMALL), "full").totals()
    assert gc.get_threshold() == before
