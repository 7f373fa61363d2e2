"""Start N ranks of a function, collect what each returns, and never hang.

Each rank is a spawned process that joins a gloo (CPU) or NCCL (GPU) process group through a
rendezvous file (fixed TCP ports collide between concurrent runs, NOTES.md C2), runs
``fn(rank, world, *args)`` and sends back its result. The parent waits at most ``timeout``
seconds: a rank that raises, dies or overstays ends the whole run with ``RankFailure`` naming
it, and the other ranks are killed.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from clustersim.plugins import load_plugins

GRACE_S = 1.0  # after a first failure, how long to wait for the others' news


class RankFailure(RuntimeError):
    """A rank failed, died or timed out; ``rank`` says which."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} {reason}")
        self.rank = rank
        self.reason = reason


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0,
              backend: str = "gloo") -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` processes; their results, in rank order."""
    ctx = mp.get_context("spawn")
    results: Any = ctx.SimpleQueue()
    fd, init_file = tempfile.mkstemp(prefix="clustersim-rdzv-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it; a stale one would confuse it
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, world, init_file, backend,
                                                   timeout, args, results), daemon=True)
             for rank in range(world)]
    for proc in procs:
        proc.start()
    try:
        return _collect(procs, results, world, timeout)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        if os.path.exists(init_file):
            os.unlink(init_file)


def _collect(procs: list, results: Any, world: int, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    got: dict[int, Any] = {}
    failed: dict[int, str] = {}
    while len(got) < world:
        while not results.empty():
            rank, ok, value = results.get()
            (got if ok else failed)[rank] = value
        died = {rank: proc.exitcode for rank, proc in enumerate(procs)
                if rank not in got and rank not in failed and proc.exitcode not in (None, 0)}
        if failed or died:
            _blame(procs, results, got, failed, died)
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if r not in got]
            raise RankFailure(missing[0], f"timed out after {timeout:.0f} s (no result from "
                                          f"ranks {missing})")
        time.sleep(0.02)
    return [got[r] for r in range(world)]


def _blame(procs: list, results: Any, got: dict, failed: dict, died: dict) -> None:
    """Raise for the rank at the root of a failure. A rank that dies makes its peers' next
    collective fail too, so wait a moment for the whole picture and blame a dead rank first."""
    time.sleep(GRACE_S)
    while not results.empty():
        rank, ok, value = results.get()
        (got if ok else failed)[rank] = value
    died.update({rank: proc.exitcode for rank, proc in enumerate(procs)
                 if rank not in got and rank not in failed and proc.exitcode not in (None, 0)})
    if died:
        rank = min(died)
        raise RankFailure(rank, f"died (exit code {died[rank]})")
    rank = next(iter(failed))  # the first to report: its peers failed because of it
    raise RankFailure(rank, f"failed:\n{failed[rank]}")


def _rank_main(fn, rank: int, world: int, init_file: str, backend: str, timeout: float,
               args: tuple, results: Any) -> None:
    import torch
    torch.set_num_threads(1)  # ranks share the machine's cores (NOTES.md C2)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        if backend == "nccl":  # one GPU per rank
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout))
        load_plugins()  # a spawned rank: the schedules installed plugins register
        value = fn(rank, world, *args)
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

