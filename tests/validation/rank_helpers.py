"""Rank functions for the launcher's tests (importable by spawned processes)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def echo(rank: int, world: int) -> int:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return int(t.item())


def dies(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(3)  # as if killed: no exception, no result
    dist.barrier()


def raises(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("bad shard")
    dist.barrier()


def hangs(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(3600)
    dist.barrier()
