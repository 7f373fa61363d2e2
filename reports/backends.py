"""Where a sweep's points run: this machine's cores, or a Ray cluster.

A runner takes the jobs (plain dicts) and yields their rows in completion order. Both call the
same top-level ``simulate_point``, so the table does not depend on where it was computed.
The local pool itself is ``processes.py``'s, which the planner uses too (``plan --jobs``).
"""

from __future__ import annotations

from collections.abc import Iterator

from clustersim.errors import ScenarioError

from .processes import completed, default_jobs
from .ray_workers import ray_session, require_ray
from .sweep import Runner, simulate_point

BACKENDS = ("local", "ray")


def local_runner(jobs: int) -> Runner:
    """``jobs`` worker processes (in this process when 1)."""
    def run(points: list[dict]) -> Iterator[dict]:
        yield from (row for _, row in completed(simulate_point, points, jobs))
    return run


def ray_runner(address: str | None, jobs: int | None) -> Runner:
    """The points as Ray tasks through Ray's multiprocessing Pool (``ray.util.multiprocessing``).

    ``address`` (or the environment's ``RAY_ADDRESS``) names a running cluster; without one Ray
    starts a local instance (``ray_workers.ray_session``, the planner's too). Points are sent
    in batches: one task per point wastes Ray's per-task overhead on points that take
    milliseconds.
    """
    require_ray()

    def run(points: list[dict]) -> Iterator[dict]:
        if not points:
            return
        from ray.util.multiprocessing import Pool
        with ray_session(address, jobs) as workers:
            pool = Pool()
            try:
                chunk = max(1, len(points) // (4 * workers))
                yield from pool.imap_unordered(simulate_point, points, chunksize=chunk)
            finally:
                pool.terminate()
    return run


def make_runner(backend: str, jobs: int | None, address: str | None = None) -> Runner:
    if backend == "ray":
        return ray_runner(address, jobs)
    if address:
        raise ScenarioError("--address", "only applies to --backend ray")
    return local_runner(jobs or default_jobs())
