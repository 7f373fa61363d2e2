"""Every collective clustersim can time, by name: declared once, read by every entry point.

A ``Collective`` gives what each consumer asks of it: its closed-form time over a placed group
(``network.GroupLinks``: the representative communicator, the per-layer costs, ``clustersim
collective --fidelity representative``), nccl-tests' factor from algorithm to bus bandwidth,
and how the full-fidelity fabric runs it as flows. Every shipped collective is declared by its
algorithms alone (``collective_algorithms.py``): for each, what every member sends on NVLink
and on its NIC, to which peers, and its latency steps, NCCL's ``nsteps`` and ``nInterSteps``
(nccl src/graph/tuning.cc, ``ncclTopoTuneModel``). Both its closed form
(``network.described_time``: the fastest algorithm, as NCCL's tuner picks) and its flows
(``Fabric.run``) derive from that one description, so they cannot drift apart: all-gather and
reduce-scatter are a ``Ring``, all-reduce its ring, tree and NVLS (``ALL_REDUCE``), all-to-all
the pairwise exchange. Adding one is a ``register_collective`` call from any module
(docs/extending.md, "A collective").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from . import network as net
from .collective_algorithms import (
    ALL_GATHER_RING,
    ALL_REDUCE,
    ALL_TO_ALL,
    Algorithm,
    Load,
    Ring,
    ring_load,
)
from .collectives import ring_time

__all__ = ["COLLECTIVES", "Algorithm", "Collective", "Load", "Ring", "collective_named",
           "described_collective", "group_ring_time", "register_collective", "ring_collective",
           "ring_load", "unregister_collective"]


@dataclass(frozen=True)
class Collective:
    """A collective: its name, closed form, bus factor and, if declared by them, its
    algorithms (by name, in the order NCCL's tuner breaks ties)."""

    name: str
    time: Callable[[net.GroupLinks, float], float]  # (group, nbytes per rank) -> seconds
    bus_factor: Callable[[int], float]  # n -> nccl-tests' busBw / algBw
    algorithms: Mapping[str, Algorithm] | None = None  # None: the fabric's method of its name


def group_ring_time(ring: Ring, g: net.GroupLinks, nbytes: float) -> float:
    """A ring's closed form over a placed group (``collectives.ring_time``)."""
    return ring_time(ring, nbytes, g.local, g.nodes, g.intra, g.inter)


def described_collective(name: str, algorithms: Mapping[str, Algorithm],
                         bus_factor: Callable[[int], float]) -> Collective:
    """A collective declared by its algorithms: its closed form is the fastest of theirs
    (``network.described_time``), and the fabric runs that one's flows (``Fabric.run``)."""
    return Collective(name, partial(net.described_time, algorithms), bus_factor, algorithms)


def ring_collective(name: str, ring: Ring, bus_factor: Callable[[int], float]) -> Collective:
    """A collective declared by its ring: closed form and flows both read ``ring``."""
    return described_collective(name, {"ring": ring}, bus_factor)


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


register_collective(described_collective("allreduce", ALL_REDUCE, _all_reduce_bus))
# Reduce-scatter is the all-gather's mirror image: the same ring, the same bytes.
register_collective(ring_collective("allgather", ALL_GATHER_RING, _one_pass_bus))
register_collective(ring_collective("reduce_scatter", ALL_GATHER_RING, _one_pass_bus))
register_collective(described_collective("alltoall", {"pairwise": ALL_TO_ALL}, _one_pass_bus))
