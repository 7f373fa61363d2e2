"""The full-fidelity network: collectives, sends and tensor-parallel rings as flows.

Over the links of ``links.py`` (every GPU's ports both ways, leaf and pod uplinks), every flow
gets its max-min fair rate over its whole path (``flows.FlowNetwork``): two flows into one GPU
share its ingress; alone a flow runs at its NIC's rate, and a spine slows it only as far as
other flows load the same uplinks.

A collective runs as its description (``topologies/collective_algorithms.py``): of its
algorithms, the one whose closed form is fastest on the tiers the group crosses, as NCCL's tuner
picks (all-reduce: ring, tree or, on an NVSwitch with NVLink SHARP, NVLS), its ``Load`` laid
out as flows, all at once, after its ``steps * alpha`` (``Fabric.run``): a ring or a tree is
one flow per member to its successor in its node's ring and one to its successor across nodes;
NVLS one flow through both directions of each member's port beside that ring across nodes; an
all-to-all one flow per pair. It ends when its slowest flow ends, as a ring runs at the pace of
its slowest link. The closed form reads the same ``Load``, so alone on an idle fabric the flows
take the closed form's time.

With ``width`` above 1, each simulated GPU stands for the ``width`` peers of its tensor-parallel
group, whose flows mirror its own (``symmetry.py``): links the peers share keep ``1/width``;
or, ``mirrored``, where the peers' NICs differ (their ECMP spines, a degraded NIC), it issues
each peer's flows itself (the same pairs, ``1 .. width - 1`` GPUs on) and a collective ends
with the slowest of them; its NVLink port runs at its group's slowest.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

import simpy

from clustersim.topologies.collective_algorithms import (
    ALL,
    ALL_GATHER_RING,
    ALL_REDUCE,
    ALL_TO_ALL,
    SWITCH,
    Algorithm,
    Load,
    Ring,
    TierCost,
    fastest,
    ring_load,
    usable_load,
)
from clustersim.topologies.collective_registry import collective_named
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.profile import Profile

from .links import FabricLinks


class Fabric(FabricLinks):
    """Collectives, sends and TP rings as flows over a cluster's links (``links.py``)."""

    def __init__(self, env: simpy.Environment, cluster: ClusterSpec, profile: Profile,
                 width: int = 1, mirrored: bool = False) -> None:
        super().__init__(env, cluster, profile, width, mirrored)
        self._levels_of: dict[tuple[int, ...], tuple] = {}  # members -> ``_levels``

    def flow(self, src: int, dst: int, nbytes: float, after: float = 0.0) -> simpy.Event:
        """``nbytes`` from ``src`` to ``dst`` along its path, starting ``after`` from now (and
        its peers' mirror flows, ``mirrors``: an event when the last is through)."""
        if len(self.mirrors) > 1:
            return self.network.bundle([(self._cached_path(src + o, dst + o), nbytes)
                                        for o in self.mirrors], after)
        return self.network.transfer(self._cached_path(src, dst), nbytes, after)

    def flows(self, pairs: Sequence[tuple[int, int, float]]) -> simpy.Event:
        """Each (src, dst, bytes) as a flow, all at once: an event when the last is through."""
        return self.network.bundle([(self._cached_path(a, b), x)
                                    for a, b, x in self._mirrored(pairs)])

    def _mirrored(self, pairs: Sequence[tuple[int, int, float]]) -> Sequence[tuple]:
        """``pairs`` and, ``mirrors``, each peer's same pairs ``o`` GPUs on."""
        if len(self.mirrors) == 1:
            return pairs
        return [(a + o, b + o, x) for o in self.mirrors for a, b, x in pairs]

    def p2p(self, src: int, dst: int, nbytes: float, messages: float = 1) -> Generator:
        """``messages`` messages of ``nbytes`` in all, one after another: ``messages * alpha +
        X/B`` alone, slower when it shares the link."""
        yield self.flow(src, dst, nbytes, messages * self.tiers[self.tier(src, dst)].latency)

    def allreduce(self, members: Sequence[int], nbytes: float) -> Generator:
        """NCCL's all-reduce: its ring, its tree or NVLS, whichever the closed form finds
        fastest on the tiers the group crosses (``collective_algorithms.ALL_REDUCE``)."""
        yield from self.run(ALL_REDUCE, members, nbytes)

    def allgather(self, members: Sequence[int], nbytes: float) -> Generator:
        """All-gather into ``nbytes``: one pipelined ring through every node."""
        yield from self.ring(ALL_GATHER_RING, members, nbytes)

    def reduce_scatter(self, members: Sequence[int], nbytes: float) -> Generator:
        """Reduce-scatter of ``nbytes``: the all-gather's mirror image, the same flows."""
        yield from self.allgather(members, nbytes)

    def collective(self, op: str, members: Sequence[int], nbytes: float,
                   **options: float) -> Generator:
        """Registered collective ``op`` as flows: the algorithms it declares (``run``), else
        the method of its name here (``topologies/collective_registry.py``)."""
        algorithms = collective_named(op).algorithms
        if algorithms is None:
            return getattr(self, op)(members, nbytes, **options)
        return self.run(algorithms, members, nbytes, **options)

    def ring(self, ring: Ring, members: Sequence[int], nbytes: float) -> Generator:
        """A collective declared as a ``Ring``: each member sends ``ring.sent(n) * nbytes``
        to its successor, laid over the tiers as NCCL's channels are, after its steps' alphas;
        the closed form ``collectives.ring_time`` reads the same."""
        yield from self.run({"ring": ring}, members, nbytes)

    def run(self, algorithms: Mapping[str, Algorithm], members: Sequence[int], nbytes: float,
            rounds: float = 1) -> Generator:
        """A described collective as flows, ``rounds`` times back to back: of ``algorithms``,
        the one whose closed form is fastest between these members (NCCL's tuner,
        ``collective_algorithms.fastest``), its ``Load`` laid out as its peers say
        (``_lay_out``)."""
        local, cross = self._levels(members)
        shape = len(local[0]), len(cross[0]), len(members)
        intra = self.tiers["intra_node"]
        name = next(iter(algorithms))
        if len(algorithms) > 1:
            name = fastest(algorithms, nbytes, *shape[:2], intra, self._slowest(cross), shape[2])
        load = usable_load(algorithms[name], nbytes, *shape, intra)
        if load is None:
            raise ValueError(f"collective algorithm {name!r} cannot run over {len(members)} "
                             f"GPUs, {shape[0]} a node, on this cluster")
        yield from self._lay_out(load, local, cross, members, rounds)

    def _lay_out(self, load: Load, local, cross, members: Sequence[int],
                 rounds: float) -> Generator:
        """A ``Load`` as flows (``collective_algorithms.Load.peers``): to ring successors
        (``_pipelined``), through each member's NVSwitch port (``_switch``) or to every other
        member (``_pairwise``), ``rounds`` times the bytes after ``rounds`` times the alphas."""
        if rounds <= 0:
            return
        if load.peers == ALL:
            yield from self._pairwise(load, local, members, rounds)
        elif load.peers == SWITCH:
            yield from self._switch(load, local, cross, rounds)
        else:
            yield from self._pipelined(local, cross, rounds * load.nvlink, rounds * load.nic,
                                       rounds * load.intra_steps, rounds * load.inter_steps)

    def _switch(self, load: Load, local, cross, rounds: float) -> Generator:
        """NVLink SHARP in each node, beside a ring over the NICs across nodes (NCCL's
        NVLS_TREE): every member's port carries ``load.nvlink`` each way, one flow through both
        directions of its port. NVLS achieves less of the line than the ring's copies (the
        profile's ``nvls``): the flow carries its bytes scaled by the ring's rate over NVLS's,
        so that alone it takes the closed form's time and, sharing the port, it slows and is
        slowed as that load."""
        intra = self.tiers["intra_node"]
        scaled = rounds * load.nvlink * intra.bandwidth / intra.nvls
        yield self.env.timeout(rounds * (load.intra_steps * intra.latency
                                         + load.inter_steps * self._slowest(cross).latency))
        flows = [(self.port_path(gpu + o), scaled) for o in self.mirrors
                 for ring in local for gpu in ring]
        flows += [(self._cached_path(a, b), x)
                  for a, b, x in self._mirrored(_ring_pairs(cross, rounds * load.nic))]
        yield self.network.bundle(flows)

    def _pairwise(self, load: Load, local, members: Sequence[int], rounds: float) -> Generator:
        """NCCL's grouped sends and receives: each member's ``load.nvlink`` spread evenly over
        its node's other members and ``load.nic`` over every other node's, every pair's share
        on the wire at once, after the steps' alphas, those across nodes at the slowest tier's
        between any pair; done when the last is in."""
        n, n_local = len(members), len(local[0])
        node_of = {gpu: i for i, ring in enumerate(local) for gpu in ring}
        near = rounds * load.nvlink / (n_local - 1) if n_local > 1 else 0.0
        far = rounds * load.nic / (n - n_local) if n > n_local else 0.0
        pairs = [(a, b, near if node_of[a] == node_of[b] else far)
                 for a in members for b in members if a != b]
        pairs = [pair for pair in pairs if pair[2] > 0]
        if not pairs:
            return
        alpha = max(self.tiers[self.tier(a, b)].latency for a, b, _ in pairs)
        yield self.env.timeout(rounds * (load.intra_steps * self.tiers["intra_node"].latency
                                         + load.inter_steps * alpha))
        yield self.flows(pairs)

    def _ring(self, local, cross, sent: float, steps: float, inter_steps: float,
              sender: int | None = None) -> Generator:
        """A ring through all ranks, each sending ``sent`` bytes, laid over the tiers as
        ``collective_algorithms.ring_load`` counts them. With a ``sender``, only that
        member's flows."""
        load = ring_load(sent, steps, inter_steps, len(local[0]), len(cross[0]))
        yield from self._pipelined(local, cross, load.nvlink, load.nic, load.intra_steps,
                                   load.inter_steps, sender)

    def _pipelined(self, local, cross, intra_bytes: float, inter_bytes: float,
                   intra_steps: float, inter_steps: float,
                   sender: int | None = None) -> Generator:
        """Every member (or only ``sender``) sends ``intra_bytes`` to its successor in its
        node's ring and ``inter_bytes`` to its successor across nodes, all at once, after the
        steps' alphas (across nodes, of the slowest tier crossed); done when the last flow is."""
        pairs = _ring_pairs(local, intra_bytes, sender) + _ring_pairs(cross, inter_bytes, sender)
        if not pairs:
            return
        alpha = (intra_steps * self.tiers["intra_node"].latency
                 + inter_steps * self._slowest(cross).latency)
        yield self.env.timeout(alpha)
        yield self.flows(pairs)

    def tensor_ring(self, gpu: int, nbytes: float, steps: float) -> Generator:
        """One member's share of its tensor-parallel group's rings inside a node: ``steps``
        NVLink alphas, then ``nbytes`` out through its port and, as its predecessor sends it as
        much, ``nbytes`` in through its own: one flow over both directions of its port. Every
        member of such a ring carries exactly this, so one stands for all (``symmetry.py``). The
        flow is reserved (``FlowNetwork.reserve``): where nothing else crosses the port while it
        runs (the group owns it: data-parallel and pipeline peers in other nodes), one timer."""
        if nbytes <= 0:
            return
        yield self.port_ring(gpu, nbytes, steps)

    def port_ring(self, gpu: int, nbytes: float, steps: float,
                  at_once: bool = False) -> simpy.Event:
        """``tensor_ring`` started now, as an event: done when its flow is (``at_once``: for
        a caller that waits on it at once, ``FlowNetwork.reserve``)."""
        return self.network.reserve(self.port_path(gpu), nbytes,
                                    steps * self.tiers["intra_node"].latency, at_once)

    def member_ring(self, gpu: int, members: Sequence[int], nbytes: float,
                    steps: float, inter_steps: float) -> Generator:
        """One member's share of ring collectives over a group that spans nodes (a tensor-
        parallel group wider than a node): the pipelined ring's flows of that member alone
        (``_ring``), after ``steps`` alphas of which ``inter_steps`` cross nodes (each
        collective's ``Ring.inter_steps``, ``layer_comm.tensor_traffic``). Every member sends
        alike, so none waits for another; each one's predecessors send into its ports."""
        local, cross = self._levels(members)
        yield from self._ring(local, cross, nbytes, steps, inter_steps, sender=gpu)

    def alltoall(self, members: Sequence[int], nbytes: float, rounds: float = 1) -> Generator:
        """``rounds`` all-to-alls of ``nbytes`` per member, run back to back: every pair's
        ``nbytes / n`` on the wire at once (``collective_algorithms.Pairwise``)."""
        yield from self.run({"pairwise": ALL_TO_ALL}, members, nbytes, rounds)

    def _slowest(self, rings: Sequence[Sequence[int]]) -> TierCost:
        """The slowest tier between neighbours of the rings (decides ring against tree)."""
        tiers = {self.tier(ring[i], ring[(i + 1) % len(ring)]) for ring in rings
                 for i in range(len(ring)) if len(ring) > 1}
        return min((self.tiers[t] for t in tiers), key=lambda t: t.bandwidth,
                   default=self.tiers["intra_node"])

    def _levels(self, members: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
        """(rings inside each node, rings across nodes: one per local position), once per
        group: a data-parallel group runs dozens of collectives a step."""
        key = tuple(members)
        levels = self._levels_of.get(key)
        if levels is None:
            levels = self._levels_of[key] = self._levels_once(key)
        return levels

    def _levels_once(self, members: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]]]:
        by_node: dict[int, list[int]] = {}
        for gpu in members:
            by_node.setdefault(self.node(gpu), []).append(gpu)
        local = list(by_node.values())
        if len({len(ring) for ring in local}) > 1:  # uneven: one flat ring over everyone
            return [[gpu] for gpu in members], [list(members)]
        return local, [list(ring) for ring in zip(*local, strict=True)]


def _ring_pairs(rings: Sequence[Sequence[int]], nbytes: float,
                sender: int | None = None) -> list[tuple[int, int, float]]:
    """(member, its successor, ``nbytes``) around every ring, or only ``sender``'s."""
    if nbytes <= 0:
        return []
    if sender is not None:
        return [(sender, ring[(ring.index(sender) + 1) % len(ring)], nbytes) for ring in rings
                if len(ring) > 1 and sender in ring]
    return [(ring[i], ring[(i + 1) % len(ring)], nbytes) for ring in rings if len(ring) > 1
            for i in range(len(ring))]
