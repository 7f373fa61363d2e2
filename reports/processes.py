"""Work spread over this machine's cores: the local pool of sweeps (``backends.local_runner``)
and of the planner (``plan --jobs``). Kept apart from ``backends.py``, which imports pandas
through the sweep, so that ``clustersim plan`` starts without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

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


def in_order(work: Callable[[Item], Out], items: Sequence[Item], jobs: int) -> list[Out]:
    """``work`` of each item over ``jobs`` processes, the results in the items' order: the
    same list whatever the number of processes, as long as ``work`` is deterministic."""
    results = dict(completed(work, items, jobs))
    return [results[i] for i in range(len(items))]
