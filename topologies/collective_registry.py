"""Every collective clustersim can time, by name: declared once, read by every entry point.

A ``Collective`` gives what each consumer asks of it: its closed-form time over a placed group
(``network.GroupLinks``: the representative communicator, the per-layer costs, ``clustersim
collective --fidelity representative``), nccl-tests' factor from algorithm to bus bandwidth,
and how the full-fidelity fabric runs it as flows. The shipped four (all-reduce, all-gather,
reduce-scatter, all-to-all) have closed forms of their own in ``network.py`` and flows of their
own in ``simulator/fabric.py`` (a ``Fabric`` method of the same name). A new collective that
runs as a ring, as NCCL's ring algorithm runs each of its collectives, is declared by its
``Ring`` alone: the bytes each member sends its successor and the latency steps, NCCL's
``nsteps`` and ``nInterSteps`` (nccl src/graph/tuning.cc, ``ncclTopoTuneModel``). Both its
closed form (``ring_time``) and its flows (``Fabric.ring``) derive from that one description,
so they cannot drift apart. Adding one is a ``register_collective`` call from any module
(docs/extending.md, "A collective").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from . import network as net
from .collectives import pipelined_ring_time


@dataclass(frozen=True)
class Ring:
    """A collective as one pipelined ring through its ``n`` members on ``nodes`` nodes."""

    sent: Callable[[int], float]  # n -> bytes each member sends its successor, per byte of nbytes
    steps: Callable[[int, int], float]  # (n, nodes) -> latency steps in all (NCCL's nsteps)
    inter_steps: Callable[[int, int], float]  # (n, nodes) -> those across nodes (nInterSteps)


@dataclass(frozen=True)
class Collective:
    """A collective: its name, closed form, bus factor and, if declared as one, its ring."""

    name: str
    time: Callable[[net.GroupLinks, float], float]  # (group, nbytes per rank) -> seconds
    bus_factor: Callable[[int], float]  # n -> nccl-tests' busBw / algBw
    ring: Ring | None = None  # None: the fabric's method of this name runs its flows


def ring_time(ring: Ring, g: net.GroupLinks, nbytes: float) -> float:
    """A ring's closed form, pipelined over both tiers as NCCL's channels are: each member's
    ``sent`` bytes, all over NVLink in one node, else ``(local-1)/local`` of them over NVLink
    and ``1/local`` over its NIC at once (``collectives.pipelined_ring_time``); then the
    steps' latencies, those across nodes at the slower tier's."""
    if g.size <= 1:
        return 0.0
    sent = ring.sent(g.size) * nbytes
    steps = ring.steps(g.size, g.nodes)
    if g.nodes == 1:
        return sent / g.intra.bandwidth + steps * g.intra.latency
    across = ring.inter_steps(g.size, g.nodes)
    return (pipelined_ring_time(sent, g.local, g.intra, g.inter)
            + (steps - across) * g.intra.latency + across * g.inter.latency)


def ring_collective(name: str, ring: Ring, bus_factor: Callable[[int], float]) -> Collective:
    """A collective declared by its ring: closed form and flows both read ``ring``."""
    return Collective(name, partial(ring_time, ring), bus_factor, ring)


COLLECTIVES: dict[str, Collective] = {}


def register_collective(collective: Collective) -> Collective:
    """Make ``collective`` available by its name to both communicators, the nccl-tests runner
    (``simulator/bus_bandwidth.py``) and ``clustersim collective``."""
    COLLECTIVES[collective.name] = collective
    return collective


def unregister_collective(name: str) -> None:
    """Forget collective ``name`` (a test's or a notebook's toy)."""
    COLLECTIVES.pop(name, None)


def collective_named(name: str) -> Collective:
    """The registered collective ``name``; an unknown name lists the valid ones."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r} (known: "
                         f"{', '.join(COLLECTIVES)})") from None


def _all_reduce_bus(n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: all-reduce busBw = algBw * 2(n-1)/n."""
    return 2 * (n - 1) / n


def _one_pass_bus(n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: all-gather, reduce-scatter (and clustersim's all-to-all,
    as nccl-tests' alltoall_perf counts it) busBw = algBw * (n-1)/n."""
    return (n - 1) / n


register_collective(Collective("allreduce", net.allreduce_time, _all_reduce_bus))
register_collective(Collective("allgather", net.allgather_time, _one_pass_bus))
register_collective(Collective("reduce_scatter", net.reduce_scatter_time, _one_pass_bus))
register_collective(Collective("alltoall", net.alltoall_time, _one_pass_bus))
