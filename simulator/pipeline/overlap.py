"""What communication hidden behind compute still costs.

NCCL's kernels take SMs and memory bandwidth from the kernels they run beside, so compute runs
at ``1 - x`` of its speed while a collective is in flight (``x`` the profile's
``comm_compute_slowdown``, docs/profiles.md). Every closed form that hides communication behind
compute charges it here: Megatron-LM's backward TP overlap and ``tp_comm_overlap``
(``layer_comm.overlapped``), DualPipe's overlapped forward-backward pairs, in the engine
(``segments._end_pair``) and in the schedules' closed form (``list_schedule``), and
asynchronous pipeline sends (``send_hold``).
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


def send_hold(asynchronous: bool, slowdown: float) -> float:
    """The fraction of a pipeline send's transfer its sender waits: all of it for a blocking
    send; for an asynchronous one (``parallel.overlap_p2p_comm``), which runs beside the
    sender's next compute, what that compute loses meanwhile (``exposed_beside`` with the
    compute outlasting it). The message still takes its whole transfer to arrive (full
    fidelity); the representative step and the closed form charge the transfer at this
    fraction, receiver's side too, which only shortens the waits of a receiver already idle
    for it (the pipeline's fill and drain)."""
    return slowdown if asynchronous else 1.0
