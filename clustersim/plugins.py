"""Extensions installed beside clustersim: the modules of the entry-point group
``clustersim.plugins``, imported before a command runs and in each rank of a real run, so that
the schedules and collectives they register (docs/extending.md) are seen by the ``clustersim``
command too, not only by Python code that imports them itself.

A package declares its module in its own ``pyproject.toml``; nothing of clustersim's changes::

    [project.entry-points."clustersim.plugins"]
    my-schedules = "my_package.schedules"

Plumbing: this module imports nothing of clustersim's but the error type, so that every layer
may call it (``validation/launch.py``'s spawned ranks do); what a plugin imports is its own
business.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from clustersim.errors import ScenarioError

GROUP = "clustersim.plugins"


@cache
def load_plugins() -> tuple[str, ...]:
    """Import every module of the group, once per process, by entry name; their names. One
    that fails to import is bad input naming it, as any other."""
    loaded = []
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            entry.load()
        except Exception as exc:  # whatever the plugin raised: one line naming it
            raise ScenarioError("plugins", f"{entry.name} ({entry.value}) failed to "
                                           f"load: {type(exc).__name__}: {exc}") from exc
        loaded.append(entry.name)
    return tuple(loaded)
