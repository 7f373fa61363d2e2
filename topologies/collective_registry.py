"""Every collective clustersim can time, by name: declared once, read by every entry point.

A ``Collective`` gives what each consumer asks of it: its closed-form time over a placed group
(``network.GroupLinks``: the representative communicator, the per-layer costs, ``clustersim
collective --fidelity representative``), nccl-tests' factor from algorithm to bus bandwidth,
and how the full-fidelity fabric runs it as flows. A collective that runs as a ring, as NCCL's
ring algorithm runs each of its collectives, is declared by its ``Ring`` alone
(``collectives.py``): the bytes each member sends its successor and the latency steps, NCCL's
``nsteps`` and ``nInterSteps`` (nccl src/graph/tuning.cc, ``ncclTopoTuneModel``). Both its
closed form (``collectives.ring_time``) and its flows (``Fabric.ring``) derive from that one
description, so they cannot drift apart: all-gather and reduce-scatter are such rings, and so
is all-reduce's ring algorithm. All-reduce (ring, tree or NVLS, whichever is fastest) and
all-to-all keep a closed form of their own in ``network.py`` and flows of their own in
``simulator/network/fabric.py`` (a ``Fabric`` method of the same name). Adding one is a
``register_collective`` call from any module (docs/extending.md, "A collective").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from . import network as net
from .collectives import ALL_GATHER_RING, Ring, ring_time

__all__ = ["COLLECTIVES", "Collective", "Ring", "collective_named", "group_ring_time",
           "register_collective", "ring_collective", "unregister_collective"]


@dataclass(frozen=True)
class Collective:
    """A collective: its name, closed form, bus factor and, if declared as one, its ring."""

    name: str
    time: Callable[[net.GroupLinks, float], float]  # (group, nbytes per rank) -> seconds
    bus_factor: Callable[[int], float]  # n -> nccl-tests' busBw / algBw
    ring: Ring | None = None  # None: the fabric's method of this name runs its flows


def group_ring_time(ring: Ring, g: net.GroupLinks, nbytes: float) -> float:
    """A ring's closed form over a placed group (``collectives.ring_time``)."""
    return ring_time(ring, nbytes, g.local, g.nodes, g.intra, g.inter)


def ring_collective(name: str, ring: Ring, bus_factor: Callable[[int], float]) -> Collective:
    """A collective declared by its ring: closed form and flows both read ``ring``."""
    return Collective(name, partial(group_ring_time, ring), bus_factor, ring)


COLLECTIVES: dict[str, Collective] = {}


def register_collective(collective: Collective) -> Collective:
    """Make ``collective`` available by its name to both communicators, the nccl-tests runner
    (``simulator/network/bus_bandwidth.py``) and ``clustersim collective``."""
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
# Reduce-scatter is the all-gather's mirror image: the same ring, the same bytes.
register_collective(ring_collective("allgather", ALL_GATHER_RING, _one_pass_bus))
register_collective(ring_collective("reduce_scatter", ALL_GATHER_RING, _one_pass_bus))
register_collective(Collective("alltoall", net.alltoall_time, _one_pass_bus))
