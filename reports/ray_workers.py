"""A Ray cluster as the planner's pool of workers (``plan --backend ray``): the work the local
processes do (``processes.py``), on the cluster's CPUs, through the same two calls.

``ray_completed`` runs one task per item and yields results in completion order, as
``processes.completed`` does; ``RayExecutor`` is a ``concurrent.futures``-style executor over
Ray actors, each set up once by an initializer, as a ``ProcessPoolExecutor``'s workers are
(the planner's second pass keeps one layer's costs per worker across its batches). Each Ray
result is an ``ObjectRef`` whose ``future()`` is a ``concurrent.futures.Future``, so the
callers wait on it as on a local one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, as_completed
from contextlib import contextmanager
from typing import Any

from clustersim.errors import ScenarioError


def require_ray() -> Any:
    """The ``ray`` module, or one error line naming ``--backend`` when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ScenarioError("--backend", "ray is not installed: pip install "
                                         "'clustersim[ray]'") from None
    return ray


@contextmanager
def ray_session(address: str | None, jobs: int | None) -> Iterator[int]:
    """Ray, started here unless already running, for the block; yields how many workers to
    use: ``jobs``, else the cluster's CPUs. ``address`` (or ``$RAY_ADDRESS``) names a running
    cluster; without one Ray starts a local instance of ``jobs`` CPUs, shut down after."""
    ray = require_ray()
    started_here = not ray.is_initialized()
    if started_here:
        address = address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else jobs,
                 include_dashboard=False, log_to_driver=False)
    try:
        yield jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if started_here:
            ray.shutdown()


class _Worker:
    """One Ray actor: set up once by ``initializer``, then runs what it is sent."""

    def __init__(self, initializer: Callable[..., None] | None, initargs: tuple) -> None:
        if initializer is not None:
            initializer(*initargs)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class RayExecutor:
    """``submit(fn, *args)`` to the first idle one of ``workers`` actors; a ``Future`` back.
    Callers keep at most ``workers`` calls running (the planner does), so one is idle."""

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> None:
        ray = require_ray()
        actor = ray.remote(num_cpus=1)(_Worker)
        self.actors = [actor.remote(initializer, initargs) for _ in range(workers)]
        self.idle = list(self.actors)
        self.turn = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        # A future's waiters wake before its callbacks run, so an actor just done may not be
        # back in ``idle`` yet: then the next in turn queues the call.
        self.turn += 1
        worker = self.idle.pop(0) if self.idle else self.actors[self.turn % len(self.actors)]
        future = worker.run.remote(fn, *args).future()
        future.add_done_callback(lambda _: self.idle.append(worker))
        return future

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        ray = require_ray()
        for actor in self.actors:
            ray.kill(actor)


def ray_completed(work: Callable[[Any], Any], items: Sequence[Any], workers: int
                  ) -> Iterator[tuple[int, Any]]:
    """``work`` of each item on ``workers`` actors, as (its index, its result) in completion
    order."""
    with RayExecutor(workers) as pool:
        futures = {}
        pending = list(enumerate(items))
        while pending or futures:
            while pending and len(futures) < workers:
                i, item = pending.pop(0)
                futures[pool.submit(work, item)] = i
            done = next(as_completed(futures))
            yield futures.pop(done), done.result()
