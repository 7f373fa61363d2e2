"""An MoE layer's token dispatch and combine over its expert-parallel group: how many a layer
runs and what each costs, as Megatron-Core's alltoall dispatcher sends them (every routed copy to
its expert's rank, ``network.alltoall_time``) or DeepEP's forwarded kernels (once to each node a
token reaches, then over NVLink; ``parallel.moe_dispatcher: deepep``). The message sizes come from
``workload.expert_dispatch_bytes`` and ``routing.remote_nodes_per_token``; ``layer_comm`` adds
them to the layer's other exposed communication, and full fidelity runs the pairwise form as flows
(``work.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.topologies import network as net

from ..model import routing
from ..model import workload as wl

if TYPE_CHECKING:
    from .cost_model import CostModel


def expert_alltoalls(cm: CostModel) -> tuple[int, int]:
    """How many all-to-alls of ``expert_dispatch_bytes`` one layer runs, (forward, backward):
    token dispatch and combine forward and, transposed, backward; full recompute dispatches
    and combines again."""
    m, p = cm.s.model, cm.s.parallel
    if m.experts == 1 or p.ep == 1:
        return 0, 0
    return 2, 2 * (2 if p.recompute == "full" else 1)


def probs_alltoalls(cm: CostModel) -> tuple[int, int]:
    """How many all-to-alls of the routing probabilities one layer runs, (forward, backward):
    Megatron-Core's alltoall dispatcher sends them apart from the tokens in each dispatch
    (``global_probs = all_to_all(...)``, megatron/core/transformer/moe/token_dispatcher.py,
    since the memory-efficient permutation of 2025 that weights the experts' activation), and
    autograd sends their gradients back; DeepEP's dispatch carries them with the tokens
    (``topk_weights``), so none there."""
    forward, backward = expert_alltoalls(cm)
    if forward == 0 or cm.s.parallel.moe_dispatcher == "deepep":
        return 0, 0
    return forward // 2, backward // 2


def expert_comm(cm: CostModel) -> tuple[float, float]:
    """The layer's ``expert_alltoalls`` and ``probs_alltoalls`` over the EP group, (forward,
    backward). Exposed: Megatron-Core's dispatchers wait for them."""
    forward, backward = expert_alltoalls(cm)
    if forward == 0:
        return 0.0, 0.0
    one = expert_dispatch_time(cm)
    probs = probs_comm(cm)
    return forward * one + probs[0], backward * one + probs[1]


def probs_comm(cm: CostModel) -> tuple[float, float]:
    """The layer's ``probs_alltoalls``, (forward, backward): small messages, each mostly the
    all-to-all's latency."""
    forward, backward = probs_alltoalls(cm)
    if forward == 0:
        return 0.0, 0.0
    one = net.alltoall_time(cm.ep, wl.expert_probs_bytes(cm.s))
    return forward * one, backward * one


def forwarded_dispatch(cm: CostModel) -> bool:
    """Whether the token all-to-alls cross nodes as DeepEP sends them, once a node
    (``parallel.moe_dispatcher: deepep`` over an EP group that spans nodes)."""
    return cm.s.parallel.moe_dispatcher == "deepep" and cm.ep.nodes > 1


def expert_dispatch_time(cm: CostModel) -> float:
    """One token dispatch or combine: a pairwise all-to-all of ``expert_dispatch_bytes``, or,
    forwarded (``forwarded_dispatch``), one copy of the rank's tokens to each other node its
    experts reach while the copies that arrive fan out over NVLink (``routing.forwarded_bytes``),
    the two at once. The combine sums
    a node's copies before sending back: the same bytes."""
    nbytes, g = wl.expert_dispatch_bytes(cm.s), cm.ep
    if not forwarded_dispatch(cm):
        return net.alltoall_time(g, nbytes)
    return net.forwarded_alltoall_time(g, *routing.forwarded_bytes(cm.s.model, nbytes, g.local,
                                                                   g.size))
