"""How far a long simulation has got, for whoever shows it (the CLI's progress bar).

Engines report the actions their ranks have run out of all they will run; nothing listens
unless a caller asks (``listening``), so the library stays silent and the report costs one
counter per action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Listener = Callable[[int, int], None]  # (actions run, actions in all)
_listener: ContextVar[Listener | None] = ContextVar("clustersim_progress", default=None)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send the progress of every simulation run inside the block to ``listener``."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def current() -> Listener | None:
    """The listener of the running block, if any."""
    return _listener.get()
