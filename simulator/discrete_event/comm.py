"""How the engine's ranks talk: two communicators with one interface, one per fidelity.

``ClosedFormComm`` (representative): peers are symmetric, so a collective costs its closed
form over the tiers its group spans and a rank never waits for its peers. ``FabricComm``
(full): a collective starts when the last member of its group joins it and runs as flows on
the ``Fabric``, so concurrent data-parallel and pipeline traffic slow each other down.
Groups: ``"dp"`` reduces dense gradients over the dp*cp replicas, ``"edp"`` an expert's over
the replicas holding it, ``"ep"`` exchanges tokens among ep consecutive replicas (Megatron-Core
carves expert parallelism out of data parallelism; folded over a stage's ranks under
``expert_tp`` 1, ``FabricComm._folded``); under hybrid sharding
``"dps"`` holds one copy of the ZeRO states and ``"dpr"`` the copies' same shard
(``dp_reduction.py``). Operations: allreduce, reduce_scatter, allgather, alltoall, or any
other collective of the registry (``topologies/collective_registry.py``).
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from clustersim.topologies import network as net
from clustersim.topologies.collective_registry import collective_named

from ..costs.cost_model import CostModel
from ..costs.stage_costs import StageCosts
from ..inputs.placement import Placement
from ..network.fabric import Fabric


class ClosedFormComm:
    """Representative fidelity: closed-form alpha-beta costs, no rendezvous, no contention.

    A rank's collectives cost what its stage's cost model says (on a cluster of pools, its
    pool's links); a pipeline send what the links between the two stages allow. Representative
    ranks sit at tp = cp = dp = 0, so a rank's stage is its id over the pp stride."""

    def __init__(self, env: simpy.Environment, costs: StageCosts, stage_stride: int) -> None:
        self.env = env
        self.costs = costs
        self.stride = stage_stride

    def links(self, rank: int, group: str) -> net.GroupLinks:
        """The links of ``rank``'s ``group`` ("dp", "edp" or "ep"): its stage's cost model's."""
        cm = self.costs.stage(rank // self.stride)
        return {"dp": cm.dp, "edp": cm.edp, "ep": cm.ep, "dps": cm.dps, "dpr": cm.dpr}[group]

    def group_size(self, rank: int, group: str) -> int:
        return self.links(rank, group).size

    def p2p(self, src: int, dst: int, nbytes: float) -> Generator:
        yield self.env.timeout(self.p2p_seconds(src, dst, nbytes))

    def p2p_seconds(self, src: int, dst: int, nbytes: float) -> float | None:
        """How long a transfer takes once it starts: known up front, as nothing contends."""
        links = self.costs.send_links(src // self.stride, dst // self.stride)
        return net.p2p_time(links, nbytes)

    def expert_alltoall(self, rank: int, nbytes: float, rounds: float) -> Generator | None:
        """None: the layer's closed form (``token_dispatch.expert_comm``) already charges them."""
        return None

    def tensor_parallel(self, rank: int, nbytes: float, steps: float,
                        inter_steps: float = 0.0) -> Generator | None:
        """None: the layer's closed form (``layer_comm.tensor_comm``) already charges them."""
        return None

    def context_parallel(self, rank: int, nbytes: float, steps: float) -> Generator | None:
        """None: the layer's closed form (``layer_comm.context_comm``) already charges them."""
        return None

    def collective(self, rank: int, group: str, op: str, nbytes: float) -> Generator:
        yield self.env.timeout(collective_named(op).time(self.links(rank, group), nbytes))


class PortRing:
    """A rank's share of its tensor-parallel group's rings inside a node, not started yet:
    ``yield from`` it runs it as ``Fabric.tensor_ring`` does; ``start()`` starts it now and
    gives the event of its end (``Fabric.port_ring``), so that the engine waits for it, or
    runs it beside compute, without a process of its own (``Engine._started``)."""

    __slots__ = ("fabric", "gpu", "nbytes", "steps")

    def __init__(self, fabric: Fabric, gpu: int, nbytes: float, steps: float) -> None:
        self.fabric, self.gpu, self.nbytes, self.steps = fabric, gpu, nbytes, steps

    def start(self, at_once: bool = False) -> simpy.Event:
        """Start it; ``at_once``: for a caller that waits on the event at once."""
        if self.nbytes <= 0:  # nothing to send: done at once, as the generator is
            return self.fabric.env.event().succeed()
        return self.fabric.port_ring(self.gpu, self.nbytes, self.steps, at_once)

    def current(self, event: simpy.Event) -> simpy.Event:
        """What to wait on for ``event``, one of ``start(at_once=True)``'s, from now
        (``FlowNetwork.current``)."""
        return self.fabric.network.current(event)

    def __iter__(self) -> Generator:
        return self.fabric.tensor_ring(self.gpu, self.nbytes, self.steps)


class JoinedRing(PortRing):
    """``PortRing`` for a group whose every member is simulated: the members' rings start
    together once the last member has called it (``FabricComm.join_ring``), as an NCCL ring
    completes only when every member has joined. A member that calls first waits there, its
    NCCL kernel launched and holding its SMs (the engine counts it from the call)."""

    __slots__ = ("comm", "members")

    def __init__(self, comm: FabricComm, gpu: int, members: tuple[int, ...], nbytes: float,
                 steps: float) -> None:
        super().__init__(comm.fabric, gpu, nbytes, steps)
        self.comm, self.members = comm, members

    def start(self, at_once: bool = False) -> simpy.Event:
        if self.nbytes <= 0:
            return self.fabric.env.event().succeed()
        return self.comm.join_ring(self.gpu, self.members, self.nbytes, self.steps)

    def current(self, event: simpy.Event) -> simpy.Event:
        return event

    def __iter__(self) -> Generator:
        yield self.start()


class FabricComm:
    """Full fidelity: every member joins; the collective then runs as flows on the fabric."""

    def __init__(self, env: simpy.Environment, cm: CostModel, placement: Placement,
                 width: int = 1, mirrored: bool = False) -> None:
        self.env = env
        self.fabric = Fabric(env, cm.s.cluster, cm.profile, width, mirrored)
        # Every member of a TP group simulated: their rings wait for one another (one
        # simulated rank per group stands for peers that run in step, ``symmetry.py``)
        self.joins_tp = width == 1
        self.placement = placement
        p = cm.s.parallel
        self.ep, self.folded = p.ep, p.folded
        self.dp_shard = p.state_shards // p.cp  # dp ranks of one copy of the states
        self._members: dict[tuple[int, str], tuple[int, ...]] = {}
        self._joined: dict[tuple[str, tuple[int, ...], int], list] = {}  # -> [count, waited on]
        self._calls: dict[tuple[int, str], int] = {}

    def group_size(self, rank: int, group: str) -> int:
        return len(self.members(rank, group))

    def members(self, rank: int, group: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s group: its replicas (same tp and pp coordinates), or, for
        ``"tp"``, its tensor-parallel peers (same cp, dp and pp coordinates)."""
        key = (rank, group)
        if key not in self._members:
            st, sizes = self.placement.strides, self.placement.sizes
            if group == "tp":
                base = rank - (rank // st["tp"]) % sizes["tp"] * st["tp"]
                self._members[key] = tuple(base + t * st["tp"] for t in range(sizes["tp"]))
                return self._members[key]
            if group in ("ep", "edp") and self.folded:
                self._members[key] = self._folded(rank, group)
                return self._members[key]
            base = rank - (rank // st["dp"]) % sizes["dp"] * st["dp"]
            base -= (rank // st["cp"]) % sizes["cp"] * st["cp"]
            replicas = sorted(base + d * st["dp"] + c * st["cp"]
                              for d in range(sizes["dp"]) for c in range(sizes["cp"]))
            index = replicas.index(rank)
            if group in ("dps", "dpr"):  # hybrid sharding: a copy, or the copies' same shard
                replicas = self._hybrid(replicas, rank, group)
            elif group == "edp":  # every ep-th replica holds the same experts
                replicas = replicas[index % self.ep::self.ep]
            elif group == "ep":  # ... and ep consecutive replicas hold all the experts
                first = index - index % self.ep
                replicas = replicas[first:first + self.ep]
            self._members[key] = tuple(replicas)
        return self._members[key]

    def _folded(self, rank: int, group: str) -> tuple[int, ...]:
        """``rank``'s expert group under parallel folding (``expert_tp`` 1): among its stage's
        consecutive ranks (pp outermost, ``rules.py``), the ``ep`` consecutive ones ("ep") or
        those ``ep`` apart ("edp"), Megatron-Core's expert numbering etp-ep-edp-pp."""
        sizes = self.placement.sizes
        stage = sizes["tp"] * sizes["cp"] * sizes["dp"]
        base, index = rank - rank % stage, rank % stage
        if group == "ep":
            first = base + index - index % self.ep
            return tuple(range(first, first + self.ep))
        return tuple(range(base + index % self.ep, base + stage, self.ep))

    def _hybrid(self, replicas: list[int], rank: int, group: str) -> list[int]:
        """``rank``'s hybrid-sharding group among its ``replicas``: those whose dp coordinate
        falls in its copy's ``dp_shard`` ("dps", every cp rank with them), or those at its own
        place in every copy ("dpr")."""
        st, sizes, shard = self.placement.strides, self.placement.sizes, self.dp_shard
        dp_of = lambda r: (r // st["dp"]) % sizes["dp"]  # noqa: E731
        cp_of = lambda r: (r // st["cp"]) % sizes["cp"]  # noqa: E731
        if group == "dps":
            return [r for r in replicas if dp_of(r) // shard == dp_of(rank) // shard]
        return [r for r in replicas
                if dp_of(r) % shard == dp_of(rank) % shard and cp_of(r) == cp_of(rank)]

    def p2p(self, src: int, dst: int, nbytes: float) -> Generator:
        yield from self.fabric.p2p(src, dst, nbytes)

    def p2p_seconds(self, src: int, dst: int, nbytes: float) -> float | None:
        """Unknown up front: a transfer's flow shares its links with whatever runs then."""
        return None

    def expert_alltoall(self, rank: int, nbytes: float, rounds: float) -> Generator:
        """``rounds`` token all-to-alls of ``nbytes`` per rank over ``rank``'s EP group, as
        flows sharing the NICs and switches with everything else running."""
        return self.collective(rank, "ep", "alltoall", nbytes, rounds=rounds)

    def tensor_parallel(self, rank: int, nbytes: float, steps: float,
                        inter_steps: float) -> Generator:
        """``rank``'s share of its TP group's rings as flows: through its NVLink port inside a
        node (``Fabric.tensor_ring``), to its ring successors over NVLink and its NIC when the
        group spans nodes (``Fabric.member_ring``). No join: the members' rings are alike."""
        members = self.members(rank, "tp")
        if self.fabric.node(members[0]) == self.fabric.node(members[-1]):  # members ascend
            if self.joins_tp:
                return JoinedRing(self, rank, members, nbytes, steps)
            return PortRing(self.fabric, rank, nbytes, steps)
        return self.fabric.member_ring(rank, members, nbytes, steps, inter_steps)

    def context_parallel(self, rank: int, nbytes: float, steps: float) -> Generator:
        """``rank``'s ring-attention sends to the next rank of its CP group as one flow
        (``Fabric.p2p``, after ``steps`` alphas): members send alike, so none waits for another."""
        return self.fabric.p2p(rank, self.context_successor(rank), nbytes, steps)

    def context_successor(self, rank: int) -> int:
        """The next rank of ``rank``'s context-parallel ring (same tp, dp and pp coordinates)."""
        stride, size = self.placement.strides["cp"], self.placement.sizes["cp"]
        here = (rank // stride) % size
        return rank + ((here + 1) % size - here) * stride

    def collective(self, rank: int, group: str, op: str, nbytes: float,
                   **options: float) -> Generator:
        yield self.join(rank, group, op, nbytes, **options)

    def join(self, rank: int, group: str, op: str, nbytes: float,
             **options: float) -> simpy.Event:
        """``rank`` joins its group's next collective: the event of its end, which starts as
        flows once every member has joined (``collective`` waits for it)."""
        members = self.members(rank, group)
        entry, last = self._arrive(rank, group, members, self.env.event)
        if last:
            self.env.process(self._run(op, members, nbytes, entry[1], options))
        return entry[1]

    def join_ring(self, gpu: int, members: tuple[int, ...], nbytes: float,
                  steps: float) -> simpy.Event:
        """``gpu`` joins its TP group's next ring in a node: the event of its own ring's end,
        each member's ring (``Fabric.port_ring``) started once every member has joined."""
        entry, last = self._arrive(gpu, "tp", members, dict)
        done = entry[1][gpu] = self.env.event()
        if last:
            for member, waiting in entry[1].items():
                ring = self.fabric.port_ring(member, nbytes, steps)
                ring.callbacks.append(lambda _, waiting=waiting: waiting.succeed())
        return done

    def _arrive(self, rank: int, group: str, members: tuple[int, ...],
                fresh) -> tuple[list, bool]:
        """``rank``'s next call on ``group``: the call's entry [members arrived, what they
        wait on (``fresh()`` at the first)], and whether ``rank`` is the last to arrive.
        Members issue a group's calls in the same order, so the n-th call of each member is
        the same collective."""
        call = self._calls.get((rank, group), 0)
        self._calls[(rank, group)] = call + 1
        key = (group, members, call)
        entry = self._joined.setdefault(key, [0, fresh()])
        entry[0] += 1
        if entry[0] < len(members):
            return entry, False
        del self._joined[key]
        return entry, True

    def _run(self, op: str, members: tuple[int, ...], nbytes: float, done: simpy.Event,
             options: dict[str, float]):
        yield from self.fabric.collective(op, members, nbytes, **options)
        done.succeed()
