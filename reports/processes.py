"""Work spread over this machine's cores: the local pool of sweeps (``backends.local_runner``)
and of the planner (``plan --jobs``), or over a Ray cluster for the planner (``Workers``,
``ray_workers.py``). Kept apart from ``backends.py``, which imports pandas through the sweep,
so that ``clustersim plan`` starts without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

Item = TypeVar("Item")
Out = TypeVar("Out")


def default_jobs() -> int:
    """The processes ``--jobs`` means when not given: one per core."""
    return os.cpu_count() or 1


def completed(work: Callable[[Item], Out], items: Sequence[Item], jobs: int,
              initializer: Callable[..., None] | None = None, initargs: tuple = ()
              ) -> Iterator[tuple[int, Out]]:
    """``work`` of each item, as (its index, its result) in completion order, over ``jobs``
    worker processes (in this process when 1: simplest to debug and to interrupt). ``work``
    must be a top-level function (or a ``functools.partial`` of one): it is pickled.
    ``initializer(*initargs)`` runs first in each worker (and here when in this process):
    the way to hand workers what cannot be pickled, such as a shared ``multiprocessing``
    value."""
    if jobs <= 1 or len(items) <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from ((i, work(item)) for i, item in enumerate(items))
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), initializer=initializer,
                             initargs=initargs) as pool:
        futures = {pool.submit(work, item): i for i, item in enumerate(items)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


@dataclass(frozen=True, slots=True)
class Workers:
    """Where the planner's parallel work runs: ``count`` processes of this machine, or, with
    ``ray``, ``count`` actors of a Ray cluster (``ray_workers.py``; the caller holds a
    ``ray_session`` open). The plans do not depend on it."""

    count: int = 1
    ray: bool = False

    @property
    def parallel(self) -> bool:
        return self.ray or self.count > 1

    def completed(self, work: Callable[[Item], Out], items: Sequence[Item]
                  ) -> Iterator[tuple[int, Out]]:
        """``processes.completed`` here, ``ray_workers.ray_completed`` on Ray."""
        if self.ray:
            from .ray_workers import ray_completed
            return ray_completed(work, items, self.count)
        return completed(work, items, self.count)

    def in_order(self, work: Callable[[Item], Out], items: Sequence[Item]) -> list[Out]:
        """``work`` of each item, the results in the items' order: the same list wherever
        it ran, as long as ``work`` is deterministic."""
        results = dict(self.completed(work, items))
        return [results[i] for i in range(len(items))]

    def executor(self, initializer: Callable[..., None], initargs: tuple
                 ) -> AbstractContextManager[Any]:
        """A ``concurrent.futures``-style executor of ``count`` workers, each set up once."""
        if self.ray:
            from .ray_workers import RayExecutor
            return RayExecutor(self.count, initializer, initargs)
        return ProcessPoolExecutor(max_workers=self.count, initializer=initializer,
                                   initargs=initargs)


def as_workers(jobs: int | Workers) -> Workers:
    """``jobs`` processes of this machine, or the ``Workers`` given."""
    return jobs if isinstance(jobs, Workers) else Workers(jobs)


@contextmanager
def workers_for(backend: str, jobs: int | None, address: str | None = None
                ) -> Iterator[Workers]:
    """The planner's workers for ``plan --backend``: ``jobs`` processes here (default: the
    cores), or, for ``"ray"``, a Ray session's actors (``jobs`` of them, default: the
    cluster's CPUs) for the block."""
    if backend != "ray":
        yield Workers(jobs or default_jobs())
        return
    from .ray_workers import ray_session
    with ray_session(address, jobs) as count:
        yield Workers(count, ray=True)
