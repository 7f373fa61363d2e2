"""nccl-tests' figures, predicted: one collective alone on a cluster, as ``all_reduce_perf``,
``all_gather_perf``, ``reduce_scatter_perf`` and ``alltoall_perf`` report it.

nccl-tests times one collective of ``size`` bytes over every GPU it runs on and prints its
*algorithm bandwidth* ``size / time`` and its *bus bandwidth*: the algorithm bandwidth times
``2(n-1)/n`` for all-reduce and ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, so
that a figure near the slowest link's speed means the collective used it fully
(nccl-tests doc/PERFORMANCE.md). ``size`` is the all-reduce buffer, the all-gather output, the
reduce-scatter input and each rank's all-to-all buffer: what clustersim's ``nbytes`` means too.
Any collective of the registry (``topologies/collective_registry.py``) runs here, a registered
one included; each declares its own bus factor.

In ``full`` fidelity the collective runs as flows on the fabric of the cluster (``Fabric``),
in ``representative`` as the closed forms over the tiers its group spans (``network``).
"""

from __future__ import annotations

import simpy

from clustersim.topologies import network as net
from clustersim.topologies.collective_registry import COLLECTIVES, collective_named
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.profile import Profile

from .fabric import Fabric

OPERATIONS = tuple(COLLECTIVES)  # the shipped ones; any registered later runs here too


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``op`` over ``n`` ranks."""
    return collective_named(op).bus_factor(n)


def collective_seconds(cluster: ClusterSpec, profile: Profile, op: str, gpus: int,
                       nbytes: float, fidelity: str = "full") -> float:
    """Seconds one ``op`` of ``nbytes`` takes over GPUs ``0 .. gpus-1``, nothing else running."""
    collective = collective_named(op)
    if fidelity == "representative":
        return collective.time(net.group_links(cluster, profile, gpus, 1), nbytes)
    env = simpy.Environment()
    fabric = Fabric(env, cluster, profile)
    env.process(fabric.collective(op, range(gpus), nbytes))
    env.run()
    return env.now


def bus_bandwidth(cluster: ClusterSpec, profile: Profile, op: str, gpus: int, nbytes: float,
                  fidelity: str = "full") -> float:
    """The bus bandwidth (bytes/s) nccl-tests would print for ``op`` over ``gpus`` GPUs."""
    seconds = collective_seconds(cluster, profile, op, gpus, nbytes, fidelity)
    return nbytes / seconds * bus_factor(op, gpus)
