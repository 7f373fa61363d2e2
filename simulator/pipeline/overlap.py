"""What communication hidden behind compute still costs.

NCCL's kernels take SMs and memory bandwidth from the kernels they run beside, so compute runs
at ``1 - x`` of its speed while a collective is in flight (``x`` the profile's
``comm_compute_slowdown``, docs/profiles.md). Every closed form that hides communication behind
compute charges it here: Megatron-LM's backward TP overlap and ``tp_comm_overlap``
(``layer_comm.overlapped``), and DualPipe's overlapped forward-backward pairs, in the engine
(``segments._end_pair``) and in the schedules' closed form (``list_schedule``).
"""

from __future__ import annotations


def exposed_beside(comm: float, compute: float, slowdown: float) -> float:
    """Seconds that ``comm`` seconds of communication started beside ``compute`` seconds of
    compute add to the critical path: if the slowed compute still ends first,
    ``(1 - x) comm >= compute``, the pair ends when the communication does; otherwise the
    compute lost ``x comm`` of its work."""
    if (1 - slowdown) * comm >= compute:
        return comm - compute
    return slowdown * comm
