"""Compute that shares its GPU with NCCL: a rank's compute slows while collectives run beside it.

NCCL kernels take SMs, so while any collective runs on a rank's DP or TP stream its compute
goes at ``1 - x`` of its speed (the profile's ``comm_compute_slowdown``, Calculon's
``processor_usage``), re-rated whenever one starts or ends (a fluid model, as ``flows.py`` for
network flows). A mixin of ``Engine``: it uses the engine's clock (``env``) and ``_spent``,
and each rank's ``slowdown``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from .rank import Rank


class SharedCompute:
    """A rank's compute at the rate its concurrent collectives leave it (mixed into ``Engine``)."""

    def _compute(self, r: Rank, seconds: float, name: str, cause: str) -> Generator:
        """``seconds`` of compute (at full speed) on the compute stream. While collectives run
        on the rank's DP or TP stream it goes at ``1 - x`` of its speed (the profile's
        ``comm_compute_slowdown``: SMs taken by NCCL), re-rated whenever one starts or ends."""
        if seconds <= 0:
            return
        start = self.env.now
        if r.slowdown == 0:
            yield self.env.timeout(seconds)
        elif self.fidelity == "full":
            yield from self._retimed(r, seconds)
        else:
            yield from self._fluid(r, seconds)
        self._spent(r, "compute", name, cause, start, self.env.now)

    def _fluid(self, r: Rank, seconds: float) -> Generator:
        """Compute at the current rate until done or until the NCCL activity changes."""
        remaining = seconds
        while True:
            rate = 1.0 - r.slowdown if r.nccl_active else 1.0
            begin = self.env.now
            done = self.env.timeout(remaining / rate)
            yield done | self._nccl_change(r)
            if done.processed:
                return
            remaining -= (self.env.now - begin) * rate

    def _retimed(self, r: Rank, seconds: float) -> Generator:
        """``_fluid``'s compute, its arithmetic step for step, without a condition to wait
        on: the main thread waits on one timer, which ``_nccl`` replaces, at the same instant
        and from the same figures as ``_fluid`` would re-rate, when the NCCL activity changes
        (full fidelity, where DP rings and the TP rings beside compute start and end often)."""
        rate = 1.0 - r.slowdown if r.nccl_active else 1.0
        now = self.env.now
        timer = self.env.timeout(seconds / rate)
        r.computing = [seconds, rate, now, now + seconds / rate, timer]
        yield timer
        r.computing = None

    def _retime(self, r: Rank) -> None:
        """The NCCL activity changed under ``r.computing``: what is left of it at the new rate,
        on a new timer that the main thread now waits on (SimPy cannot cancel the old one: it
        goes off with no one waiting). A timer due this instant is left to end the compute, as
        ``_fluid``'s condition, triggered by it first, ends it."""
        remaining, rate, begin, due, timer = r.computing
        now = self.env.now
        if due <= now:
            return
        remaining -= (now - begin) * rate
        rate = 1.0 - r.slowdown if r.nccl_active else 1.0
        again = self.env.timeout(remaining / rate)
        again.callbacks, timer.callbacks = timer.callbacks, []
        r.computing = [remaining, rate, now, now + remaining / rate, again]

    def _nccl_change(self, r: Rank) -> simpy.Event:
        if r.nccl_change is None:
            r.nccl_change = self.env.event()
        return r.nccl_change

    def _nccl(self, r: Rank, delta: int) -> None:
        """A collective starts (+1) or ends (-1) on the rank: compute in flight is re-rated."""
        r.nccl_active += delta
        if r.computing is not None:
            self._retime(r)
        if r.nccl_change is not None:
            changed, r.nccl_change = r.nccl_change, None
            changed.succeed()
