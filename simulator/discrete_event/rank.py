"""One simulated GPU of the engine (``engine.py``): its streams, clock, memory and progress."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import simpy

from .timeline import Attribution, MemoryTracker


class Streams(dict):
    """A rank's queued streams by name ("tp", "dp"), each a SimPy resource of capacity one,
    made when first used: a step the walk computes never queues on one."""

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__()
        self.env = env

    def __missing__(self, name: str) -> simpy.Resource:
        self[name] = stream = simpy.Resource(self.env, capacity=1)
        return stream


@dataclass(eq=False)
class Rank:
    """One simulated GPU: its streams, its clock by cause and its memory."""

    rid: int
    stage: int
    streams: Streams  # the queued ones beside the main thread: "tp", "dp"
    clock: Attribution = field(default_factory=Attribution)
    memory: MemoryTracker = field(default_factory=MemoryTracker)
    pending: list[simpy.Event] = field(default_factory=list)  # DP ops to finish before the step
    gathers: dict[tuple[int, int], simpy.Event] = field(default_factory=dict)
    gathered: set[int] = field(default_factory=set)  # ZeRO-3 chunks left whole by a backward
    forwards: Counter = field(default_factory=Counter)  # per chunk
    backwards: Counter = field(default_factory=Counter)
    peers: tuple[int, ...] = ()  # the rank of each stage in its pipeline
    finish: float = 0.0
    nccl_active: int = 0  # collectives running on the DP or TP stream right now
    nccl_change: simpy.Event | None = None  # fires when nccl_active changes
    # full fidelity: the compute under way, [seconds left, rate, since, due, its timer]
    computing: list | None = None
    # full fidelity: the DP stream's ops, the one running first, (name, collective, done)
    dp_queue: deque = field(default_factory=deque)
    factor: float = 1.0  # this GPU's compute-time factor (cluster.variability)
    slowdown: float = 0.0  # its compute's loss beside NCCL kernels (its profile's)
    # An overlapped forward-backward pair under way: (compute, exposed comm) of each half
    pair: list[float] | None = None
    # ... and the communication of each half (forward, backward) by kind, seconds
    pair_kinds: tuple[dict[str, float], dict[str, float]] = field(default_factory=lambda: ({}, {}))
