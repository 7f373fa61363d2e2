"""The README is read in ten minutes (issue 25: at most 250 lines) and every relative link in it
and in docs/ leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    missing = [target for target in LINK.findall(page.read_text())
               if not re.match(r"(https?:|mailto:|#)", target)
               and not (page.parent / target.split("#")[0]).exists()]
    assert missing == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert unlinked == []
