"""Where each parallel coordinate puts a rank: global rank ids from (tp, cp, dp, pp) coordinates.

Megatron-LM numbers ranks with TP innermost, then CP, DP and PP outermost, so that a TP group
sits inside one NVLink domain and pipeline neighbours are a whole replica apart. ``order``
lists the dimensions innermost first; every other order is a what-if (e.g. "tp-pp-cp-dp").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import TYPE_CHECKING

from clustersim.topologies.network import spread

if TYPE_CHECKING:
    from .scenario import Scenario

DIMENSIONS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"


def parse_order(order: str) -> tuple[str, ...]:
    """``"tp-cp-dp-pp"`` as a tuple; it must name each of tp, cp, dp and pp once."""
    dims = tuple(order.split("-"))
    if sorted(dims) != sorted(DIMENSIONS):
        raise ValueError(f"order must name each of tp, cp, dp, pp once, innermost first, "
                         f"joined by '-' (got {order!r})")
    return dims


@dataclass(frozen=True)
class Placement:
    """Sizes of the four dimensions and the stride of each in the global rank numbering."""

    sizes: dict[str, int]
    order: tuple[str, ...]

    @classmethod
    def of(cls, tp: int, cp: int, dp: int, pp: int, order: str = DEFAULT_ORDER) -> Placement:
        return cls({"tp": tp, "cp": cp, "dp": dp, "pp": pp}, parse_order(order))

    @property
    def strides(self) -> dict[str, int]:
        strides, step = {}, 1
        for dim in self.order:
            strides[dim] = step
            step *= self.sizes[dim]
        return strides

    @property
    def world(self) -> int:
        return self.sizes["tp"] * self.sizes["cp"] * self.sizes["dp"] * self.sizes["pp"]

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank id of the given coordinates."""
        st = self.strides
        return tp * st["tp"] + cp * st["cp"] + dp * st["dp"] + pp * st["pp"]

    def coordinates(self) -> list[dict[str, int]]:
        """Every rank's coordinates, in global rank order."""
        ranges = [range(self.sizes[d]) for d in reversed(self.order)]
        return [dict(zip(reversed(self.order), c, strict=True)) for c in product(*ranges)]

    def context_levels(self, gpus_per_node: int) -> tuple[int, int]:
        """Hierarchical context parallelism (``cp_comm: a2a+p2p``): (the all-to-all level, the
        ring level), the all-to-all among the context-parallel ranks that share a node and the
        ring across nodes (Megatron-Core's ``--hierarchical-context-parallel-sizes``)."""
        cp, stride = self.sizes["cp"], self.strides["cp"]
        in_node = max(1, min(cp, gpus_per_node // stride)) if stride < gpus_per_node else 1
        inner = math.gcd(in_node, cp)
        return inner, cp // inner

    def replica_stride(self) -> int:
        """Stride of the data-parallel group that reduces dense gradients (dp x cp replicas):
        the smaller of the two strides when both are split."""
        st = self.strides
        if self.sizes["cp"] == 1:
            return st["dp"]
        if self.sizes["dp"] == 1:
            return st["cp"]
        return min(st["dp"], st["cp"])


def context_levels(s: Scenario) -> tuple[int, int]:
    """(the context-parallel ranks one all-to-all spans, those one ring spans) under the
    scenario's ``cp_comm``: (cp, 1) for a2a, (1, cp) for p2p and allgather, a node's CP ranks
    and the ring across nodes for a2a+p2p (``Placement.context_levels``; a homogeneous
    cluster, as ``rules.py`` requires)."""
    p = s.parallel
    if p.cp_comm == "a2a":
        return p.cp, 1
    if p.cp_comm != "a2a+p2p":
        return 1, p.cp
    return scenario_placement(s).context_levels(s.cluster.gpus_per_node)


def expert_strides(placement: Placement, folded: bool, ep: int) -> tuple[int, int]:
    """(EP group's stride, expert-data-parallel group's stride) in the global numbering. The
    ``ep`` ranks holding all the experts are carved out of the dp*cp replicas, innermost first;
    folded (``expert_tp`` 1, Megatron-Core's expert ranks numbered etp-ep-edp-pp inside each
    stage's consecutive ranks: ``rules.py``), out of a stage's ranks, consecutive."""
    stride = 1 if folded else placement.replica_stride()
    return stride, stride * ep


def expert_levels(s: Scenario) -> tuple[int, int]:
    """(expert-parallel ranks a node, nodes) of the scenario's EP group, as ``CostModel``
    places it (``expert_strides``; a homogeneous cluster)."""
    p = s.parallel
    stride, _ = expert_strides(scenario_placement(s), p.folded, p.ep)
    return spread(s.cluster.gpus_per_node, p.ep, stride)


def scenario_placement(s: Scenario) -> Placement:
    """The scenario's rank numbering, also before ``rules.py`` has derived its ``dp``."""
    p = s.parallel
    dp = p.dp or max(1, s.cluster.gpus // p.model_parallel)
    return Placement.of(p.tp, p.cp, dp, p.pp, p.order)
