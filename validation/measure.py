"""What a real run measures on CPU: step times and the bytes each rank holds.

``tracemalloc`` does not see tensors and RSS carries the runtime's baseline (NOTES.md C4), so
memory is counted from the live tensors themselves: parameters, gradients and optimizer state
by ``numel * element_size``, activations through ``saved_tensors_hooks`` — every tensor autograd
keeps for a backward, deduplicated by storage, parameters excluded — held from a micro-batch's
forward until its backward, as the simulator's memory timeline holds them. On a GPU,
``torch.cuda.max_memory_allocated`` is read instead.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch
from torch import nn


class ActivationMeter:
    """Bytes saved for backward per in-flight micro-batch, and their peak sum."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {getattr(p, "_local_tensor", p).untyped_storage().data_ptr()
                       for p in model.parameters()}
        self.live: dict[tuple, dict[int, int]] = {}
        self.peak = 0

    @contextmanager
    def forward_of(self, key: tuple):
        """Count what autograd saves while this micro-batch's forward runs."""
        saved = self.live.setdefault(key, {})

        def pack(t: torch.Tensor):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.params:
                saved[ptr] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.peak = max(self.peak, self.current)

    def release(self, key: tuple) -> None:
        """The micro-batch's backward ran: its saved tensors are gone."""
        self.live.pop(key, None)

    @property
    def current(self) -> int:
        storages: dict[int, int] = {}
        for saved in self.live.values():
            storages.update(saved)
        return sum(storages.values())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state this rank holds (local shards only)."""
    def size(t) -> int:
        t = getattr(t, "_local_tensor", t)  # a DTensor (FSDP2) counts its local shard
        return t.numel() * t.element_size() if torch.is_tensor(t) else 0
    params = sum(size(p) for p in model.parameters())
    grads = sum(size(p.grad) for p in model.parameters() if p.grad is not None)
    opt = optimizer.optim if hasattr(optimizer, "optim") else optimizer  # ZeRO-1's local one
    state = sum(size(v) for s in opt.state.values() for v in s.values())
    return {"params": params, "grads": grads, "optimizer": state}


def step_statistics(times: list[float], warmup: int = 1) -> dict[str, float]:
    """Median step time after warm-up, and the spread (max - min) of those steps."""
    kept = times[warmup:] or times
    return {"step_time_s": statistics.median(kept), "step_time_spread_s": max(kept) - min(kept),
            "steps_timed": len(kept)}


class PhaseClock:
    """Seconds spent per phase (forward, backward, pp_wait, ...), summed over a step. On a GPU
    the clock synchronises first, so a phase owns the kernels it launched."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.sync = torch.cuda.synchronize if device and device.type == "cuda" else None
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        yield
        if self.sync:
            self.sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

