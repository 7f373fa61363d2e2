"""docs/extending.md's Python blocks run as written (issue 25: "docs/extending.md walks through
each; a test runs its code blocks"), so the page cannot promise an API that has moved.

The blocks run in order in one namespace, as a reader pasting them into one session would, in
an empty directory (a block may write files there). What they register is forgotten after, so
that other tests see only the shipped schedules and collectives; each block asserts what it
shows (a closed form met, a flow time equal to its closed form), so a block that still runs but
no longer holds fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clustersim.simulator.pipeline import schedules
from clustersim.topologies import collective_registry

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


@pytest.fixture
def registries():
    """The schedule and collective registries as they were, restored in place after (other
    modules hold these very dicts)."""
    saved = dict(schedules.SCHEDULES), dict(collective_registry.COLLECTIVES)
    yield
    for registry, before in zip((schedules.SCHEDULES, collective_registry.COLLECTIVES), saved,
                                strict=True):
        registry.clear()
        registry.update(before)
    schedules.splits_backward.cache_clear()


def test_the_page_walks_through_a_schedule_a_collective_and_new_hardware():
    """Registering a schedule and using it, registering a collective and timing it, and a
    GPU and cluster given as data: at least one block each."""
    blocks = python_blocks()
    assert any("register_schedule(" in b for b in blocks)
    assert any("clustersim.plan(" in b and "fidelity=\"full\"" in b for b in blocks)
    assert any("register_collective(" in b for b in blocks)
    assert any("collective_seconds(" in b and "main([\"collective\"" in b for b in blocks)
    assert any("gpu:" in b and "peak_flops" in b for b in blocks)


def test_every_python_block_runs(registries, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "extending_md"}
    for number, block in enumerate(python_blocks(), start=1):
        try:
            exec(compile(block, f"{PAGE.name} block {number}", "exec"), namespace)
        except Exception as exc:  # name the block, then let pytest show the traceback
            raise AssertionError(f"docs/extending.md, Python block {number} fails") from exc
    out = capsys.readouterr().out
    assert "closed form" in out and "busbw on one node" in out and "fits:" in out
    assert "my-broadcast" in schedules_or_collectives()


def schedules_or_collectives() -> set[str]:
    return set(schedules.SCHEDULES) | set(collective_registry.COLLECTIVES)
