"""Which directed links a message crosses in full fidelity, and what each carries.

Each GPU has an NVLink/NVSwitch port inside the node and a NIC between nodes, each as two
directed links (out and in), so a receiver's port is contended like a sender's. A flow that
leaves its pod also crosses its pod's uplink and the destination pod's downlink; one between
fat-tree or rail leaves a leaf uplink and downlink through the spine its ECMP hash picks (or
all of them, under adaptive routing). Links are created when first used, a port at its tier's
bandwidth less its faults and jitter. ``fabric.Fabric`` runs collectives as flows over them.

With ``width`` above 1, each simulated GPU stands for the ``width`` peers of its tensor-parallel
group (``symmetry.py``): links the peers share keep ``1/share``; or, ``mirrored``, each peer's
flows are issued for it (``mirrors``), and a simulated NVLink port runs at its group's slowest.
"""

from __future__ import annotations

import simpy

from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.network import tier_cost
from clustersim.topologies.profile import Profile

from ..inputs.variability import port_factor
from .flows import FlowNetwork


class FabricLinks:
    """The links of every GPU of a cluster and the paths between them, created when first used."""

    def __init__(self, env: simpy.Environment, cluster: ClusterSpec, profile: Profile,
                 width: int = 1, mirrored: bool = False) -> None:
        self.env = env
        self.cluster = cluster
        # GPUs each flow stands for: links they share carry 1/share; or each simulated GPU's
        # flows are issued for every peer, ``mirrors`` GPUs on (``symmetry.mirrored``)
        self.share = 1 if mirrored else width
        self.mirrors = tuple(range(width)) if mirrored else (0,)
        self.tiers = {name: tier_cost(profile, name, link) for name, link in
                      (("intra_node", cluster.intra_node), ("inter_node", cluster.inter_node),
                       ("spine", cluster.spine)) if link is not None}
        self.network = FlowNetwork(env)
        self._paths: dict[tuple[int, int], tuple] = {}  # (src, dst) -> its links (``path``)

    def node(self, gpu: int) -> int:
        return gpu // self.cluster.gpus_per_node

    def tier(self, src: int, dst: int) -> str:
        """The tier a message from ``src`` to ``dst`` crosses."""
        a, b = self.node(src), self.node(dst)
        if a == b:
            return "intra_node"
        spine = self.cluster.spine
        if spine is not None and a // spine.pod_nodes != b // spine.pod_nodes:
            return "spine"
        return "inter_node"

    def _cached_path(self, src: int, dst: int) -> tuple:
        """``path``, once per pair: the links a pair's messages cross never change."""
        path = self._paths.get((src, dst))
        if path is None:
            path = self._paths[(src, dst)] = self.path(src, dst)
        return path

    def port_path(self, gpu: int) -> tuple:
        """Both directions of ``gpu``'s NVLink port: one flow over them stands for what it
        sends its ring successor and receives from its predecessor."""
        path = self._paths.get((gpu, -1))
        if path is None:
            path = self._paths[(gpu, -1)] = (self._port("out", "intra_node", gpu),
                                              self._port("in", "intra_node", gpu))
        return path

    def path(self, src: int, dst: int) -> tuple:
        """The directed links a message crosses: the sender's port out and the receiver's port
        in (NVLink inside a node, NICs between nodes); between leaves of a pod a leaf uplink
        and downlink through the spine ECMP picks; between pods both pods' spine links. To
        another rail of a rail-optimized or rail-only pod, NVLink first to the sender's node's
        GPU on that rail, whose NIC sends it: NCCL's PXN, on by default for sends and all-to-
        all (``NCCL_PARAM(P2pPxnLevel, "P2P_PXN_LEVEL", 2)``, nccl src/graph/search.cc)."""
        tier = self.tier(src, dst)
        if tier == "intra_node":
            return self._port("out", "intra_node", src), self._port("in", "intra_node", dst)
        net, per_node = self.cluster.inter_node, self.cluster.gpus_per_node
        hops: tuple = ()
        if net.topology != "fat-tree" and src % per_node != dst % per_node:
            relay = src - src % per_node + dst % per_node  # PXN: the rail's GPU in src's node
            hops, src = (self._port("out", "intra_node", src),
                         self._port("in", "intra_node", relay)), relay
        hops += (self._port("out", "inter_node", src),)
        if tier == "spine":
            pods = self.cluster.spine.pod_nodes
            hops += (self._link(("up", self.node(src) // pods), "spine"),
                     self._link(("down", self.node(dst) // pods), "spine"))
        elif net.topology != "rail-only" and self.leaf(src) != self.leaf(dst):
            spine = self._ecmp(src, dst)
            hops += (self._link(("leaf-up", self.leaf(src), spine), "leaf"),
                     self._link(("leaf-down", self.leaf(dst), spine), "leaf"))
        return (*hops, self._port("in", "inter_node", dst))

    def _ecmp(self, src: int, dst: int) -> int:
        """The spine a flow's static ECMP hash picks: per NIC pair under fat-tree, per node
        pair under rail-optimized, where every rail plane is wired and hashes alike. Under
        adaptive routing a flow is spread over all spines: one link of their joint capacity."""
        net = self.cluster.inter_node
        if net.routing == "adaptive":
            return -1
        if net.topology == "fat-tree":
            return hash((src, dst, net.ecmp_seed)) % net.spines
        return hash((self.node(src), self.node(dst), net.ecmp_seed)) % net.spines

    def leaf(self, gpu: int) -> tuple[int, ...]:
        """The leaf switch of ``gpu``'s NIC: (group, rail) under rail-optimized, (group,)
        under fat-tree, ``leaf_ports`` NICs to a leaf."""
        net, per_node = self.cluster.inter_node, self.cluster.gpus_per_node
        if net.topology == "fat-tree":
            return (self.node(gpu) // max(1, net.leaf_ports // per_node),)
        return (self.node(gpu) // net.leaf_ports, gpu % per_node)

    def _port(self, way: str, tier: str, gpu: int) -> tuple:
        return self._link((way, tier, gpu), tier)

    def _port_link(self, key: tuple, tier: str) -> tuple:
        """A GPU's port, maybe degraded (faults, then jitter). Standing for its peers
        (``mirrors``), a simulated GPU's NVLink port runs at its group's slowest: it carries
        only the group's TP rings, which end together, with the slowest member's."""
        _, _, gpu = key
        port = "nvlink" if tier == "intra_node" else "nic"
        peers = (gpu,)
        if port == "nvlink" and len(self.mirrors) > 1 and gpu % len(self.mirrors) == 0:
            peers = tuple(gpu + o for o in self.mirrors)
        factor = min(self.cluster.fault_factor(port, g)
                     / port_factor(self.cluster.variability, g, port) for g in peers)
        self.network.add_link(key, self.tiers[tier].bandwidth * factor)
        return key

    def _link(self, key: tuple, tier: str) -> tuple:
        """A directed link of ``tier``, created on first use: a GPU's port carries the tier's
        per-GPU bandwidth, a pod's spine link that times the pod's GPUs, a leaf's link to one
        spine its share of the leaf's ports over the oversubscription. Links that several
        rails share (pod links, fat-tree leaves) keep ``1/share`` for one of ``share`` mirror
        flows (``symmetry.py``)."""
        if key not in self.network.capacity:
            if key[0] in ("out", "in"):  # a GPU's port, maybe degraded (cluster.faults)
                return self._port_link(key, tier)
            net = self.cluster.inter_node
            if tier == "leaf":
                paths = 1 if net.routing == "adaptive" else net.spines
                bandwidth = (self.tiers["inter_node"].bandwidth * net.leaf_ports
                             / (net.oversubscription * paths))
                if net.topology == "fat-tree":
                    bandwidth /= self.share
            else:  # a pod's link to the spine
                bandwidth = (self.tiers[tier].bandwidth * self.cluster.spine.pod_nodes
                             * self.cluster.gpus_per_node / self.share)
            self.network.add_link(key, bandwidth)
        return key
