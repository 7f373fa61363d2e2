"""The HTML report as a reader opens it: Debian's chromium, driven headless by Playwright for
Python, loads ``clustersim report``'s page of a small sweep and checks what a person would
notice: errors in the console, a plot that does not load, a page wider than the window, and
column headings that do not sort (issue 24: every configuration cell sorted as "512").

.ci/run installs both (apt-get install chromium, pip install playwright); elsewhere the test
is skipped, saying which is missing. Playwright's own browser download is never used."""

from __future__ import annotations

import re
import shutil

import pytest

from clustersim.cli import main
from clustersim.reports.sweep import read_table

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="Playwright for Python is not installed "
                                      "(pip install playwright; .ci/run does)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable on PATH "
                                                         "(apt-get install chromium; .ci/run does)")
VIEWPORT = {"width": 1280, "height": 800}  # a laptop's window


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A 12-point sweep of GPT 18B on 256 A100s, some out of memory, and its report."""
    folder = tmp_path_factory.mktemp("report")
    table = folder / "s.csv"
    assert main(["sweep", "examples/gpt-18b-a100.yaml", "--grid", "parallel.tp=1,2,8",
                 "--grid", "parallel.recompute=none,full", "--grid", "training.micro_batch=1,2",
                 "--set", "parallel.zero=0", "--fidelity", "analytic", "--out", str(table)]) == 0
    assert main(["report", str(table), "--out", str(folder / "r")]) == 0
    return table, folder / "r" / "report.html"


@pytest.fixture(scope="module")
def page(report):
    """The report opened in headless chromium, with every console error and page error."""
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where chromium refuses its sandbox
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport=VIEWPORT)
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(report[1].as_uri(), wait_until="load")
        yield tab, errors
        browser.close()


def test_loads_without_console_errors(page):
    tab, errors = page
    assert tab.title().startswith("clustersim sweep: gpt-18.4b on 256")
    assert errors == []


def test_every_plot_loads(page):
    tab, _ = page
    images = tab.eval_on_selector_all("img", "imgs => imgs.map(i => [i.alt, i.complete, "
                                             "i.naturalWidth, i.getBoundingClientRect().width])")
    assert {alt for alt, *_ in images} == {"breakdown", "pareto", "memory", "timeline"}
    assert all(complete and natural > 0 and shown > 0 for _, complete, natural, shown in images)


def test_nothing_is_wider_than_the_window(page):
    tab, _ = page
    wide = tab.evaluate("""() => [...document.querySelectorAll("body *")]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
        .map(e => e.tagName + ": " + e.textContent.slice(0, 40))""")
    assert wide == []
    assert tab.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]


def column(tab, heading: str) -> list[str]:
    """The cells under ``heading``, top to bottom, as the page shows them now."""
    index = tab.eval_on_selector_all("table.sortable th",
                                     f"hs => hs.findIndex(h => h.textContent === {heading!r})")
    return tab.eval_on_selector_all(f"table.sortable tbody td:nth-child({index + 1})",
                                    "cells => cells.map(c => c.textContent)")


def click(tab, heading: str) -> None:
    tab.click(f"table.sortable th:text-is({heading!r})")


def test_sorting_by_step_time_and_by_configuration_keeps_fitting_rows_first(page, report):
    """The oracle is the sweep table itself: the same rows sorted in Python."""
    tab, _ = page
    df = read_table(report[0])
    ok = df[df["status"] == "ok"].assign(fits=lambda d: d["memory.fits"].astype(str) == "True")
    fitting = int(ok["fits"].sum())
    assert 0 < fitting < len(ok)  # both kinds, or the order of the groups is not under test

    def expected_steps(ascending: bool) -> list[str]:
        rows = ok.sort_values(["fits", "step_time_s"], ascending=[False, ascending])
        return [f"{s:,.3f}" for s in rows["step_time_s"]]

    click(tab, "step s")
    assert column(tab, "step s") == expected_steps(True)
    assert column(tab, "fits in memory") == ["yes"] * fitting + ["OUT OF MEMORY"] * (
        len(ok) - fitting)
    click(tab, "step s")
    assert column(tab, "step s") == expected_steps(False)
    assert tab.get_attribute("table.sortable th:text-is('step s')", "aria-sort") == "descending"

    click(tab, "configuration")  # text, digits by value: tp1 < tp2 < tp8 within each group
    labels = column(tab, "configuration")
    tp = [int(re.search(r"\btp(\d+)", label).group(1)) for label in labels]
    assert tp[:fitting] == sorted(tp[:fitting]) and tp[fitting:] == sorted(tp[fitting:])
    assert column(tab, "fits in memory")[:fitting] == ["yes"] * fitting
