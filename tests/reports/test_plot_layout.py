"""Every plot clustersim ships keeps its text readable: each string it draws lies inside the
figure and covers no other string (matplotlib's own Agg text extents, ``layout_helpers``).

The check wraps ``Figure.savefig``, so it sees exactly the figures the commands and example
scripts write: sweep and plan plots (breakdown, Pareto, scaling, memory, timeline), the
report's, ``simulate --timeline`` for every schedule the README pictures, and the docs/
figures drawn by examples/*.py. Before issue 24 the Pareto plot's title and its right-most
configuration label ran off the figure and the labels of close points overlapped."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pandas as pd
import pytest
from layout_helpers import layout_faults
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from clustersim.cli import main
from clustersim.reports.plots import pareto_front

ROOT = Path(__file__).resolve().parents[2]
SWEEP_PLOTS = {"breakdown", "pareto", "memory", "timeline"}


@pytest.fixture
def saved(monkeypatch):
    """{file stem: layout faults} of every figure saved while the test runs."""
    faults: dict[str, list[str]] = {}
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        faults[Path(fname).stem] = layout_faults(self)
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return faults


def assert_clean(saved: dict[str, list[str]], expected: set[str]) -> None:
    assert expected <= set(saved), f"plots not drawn: {expected - set(saved)}"
    bad = {name: faults for name, faults in saved.items() if faults}
    assert not bad, bad


def test_sweep_plots_of_one_gpu_count_with_out_of_memory_rows(saved, tmp_path):
    """Pareto against memory with its numbered front, breakdown with the OOM hatch entry."""
    assert main(["sweep", "examples/gpt-18b-a100.yaml", "--grid", "parallel.tp=1,2,8",
                 "--grid", "parallel.recompute=none,full", "--grid", "training.micro_batch=1,2",
                 "--set", "parallel.zero=0", "--fidelity", "analytic",
                 "--out", str(tmp_path / "s.csv"), "--plots", str(tmp_path / "p")]) == 0
    assert_clean(saved, SWEEP_PLOTS)


def test_sweep_plots_across_gpu_counts_with_intervals(saved, tmp_path):
    """Pareto and scaling on a GPU axis, breakdown with --samples' interval bars."""
    assert main(["sweep", "examples/gpt-18b-a100.yaml", "--grid", "parallel.tp=2,8",
                 "--grid", "cluster.gpus=64,128,256", "--set", "parallel.zero=1",
                 "--fidelity", "analytic", "--samples", "3",
                 "--out", str(tmp_path / "s.csv"), "--plots", str(tmp_path / "p")]) == 0
    assert_clean(saved, SWEEP_PLOTS | {"scaling"})


def test_report_of_the_shipped_sweep(saved, tmp_path):
    """The README's figures: the report of docs/sweep-llama3-70b-512.csv draws the same."""
    assert main(["report", "docs/sweep-llama3-70b-512.csv", "--out", str(tmp_path / "r")]) == 0
    assert_clean(saved, SWEEP_PLOTS)


def test_plan_plots(saved, tmp_path):
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--top", "5", "--plots", str(tmp_path / "p")]) == 0
    assert_clean(saved, SWEEP_PLOTS)


def timeline_commands() -> list[list[str]]:
    """The ``simulate --timeline`` commands of examples/zero-bubble-timelines.sh (README)."""
    script = (ROOT / "examples/zero-bubble-timelines.sh").read_text().replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in script.splitlines()
            if line.startswith("clustersim simulate")]


@pytest.mark.parametrize("argv", timeline_commands(), ids=lambda a: a[a.index("--timeline") + 1])
def test_simulate_timeline(saved, tmp_path, argv):
    at = argv.index("--timeline") + 1
    out = tmp_path / Path(argv[at]).name
    assert main([*argv[:at], str(out), *argv[at + 1:]]) == 0
    assert_clean(saved, {out.stem})


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"),
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stragglers_figure(saved, tmp_path):
    load_example("stragglers").main(tmp_path / "stragglers.png")  # ~5 s: runs as shipped
    assert_clean(saved, {"stragglers"})


# The two fabric figures take five minutes of full-fidelity runs each; their drawing code runs
# as shipped on a stand-in step time (seconds, in the range the README prints), since only the
# text's placement is under test here.
def fake_step(*args, **kwargs) -> float:
    return 6.0 + 0.1 * kwargs.get("oversubscription", 1.0) + 0.01 * kwargs.get("ecmp_seed", 0)


def test_fabric_whatif_figure(saved, tmp_path, monkeypatch):
    example = load_example("fabric-whatif")
    monkeypatch.setattr(example, "step", fake_step)
    example.main(tmp_path / "fabric-whatif.png")
    assert_clean(saved, {"fabric-whatif"})


def test_roce_vs_infiniband_figure(saved, tmp_path, monkeypatch):
    example = load_example("roce-vs-infiniband")
    monkeypatch.setattr(example, "step", fake_step)
    example.plot(example.measure(), tmp_path / "roce-vs-infiniband.png")
    assert_clean(saved, {"roce-vs-infiniband"})


def test_the_check_sees_a_cut_off_title_and_two_labels_on_one_spot():
    """The oracle itself: text placed past the figure's edge, and twice at one point."""
    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title("a title far wider than a four-inch figure can hold, so it is cut off")
    ax.annotate("here", (0.5, 0.5))
    ax.annotate("there", (0.5, 0.5))
    faults = layout_faults(fig)
    assert any("leaves the figure" in f and "a title" in f for f in faults)
    assert "'here' overlaps 'there'" in faults


def test_pareto_numbers_of_crowded_points_stay_apart():
    """Five Pareto points within 1 GiB and 40 ms of each other among a spread of 30 GiB and
    8 s: each number finds its own place inside the axes."""
    rows = [{"status": "ok", "memory.fits": True, "gpus": 512, "tp": 8, "pp": pp,
             "dp": 512 // (8 * pp), "micro_batch": 1, "schedule": "1f1b", "virtual_stages": 1,
             "zero": 1, "recompute": "none", "memory.peak_bytes": gib * 2**30, "step_time_s": step}
            for pp, gib, step in [(1, 40.0, 7.04), (2, 40.2, 7.03), (4, 40.4, 7.02),
                                  (8, 40.6, 7.01), (16, 40.8, 7.00), (32, 20.0, 15.0),
                                  (64, 70.0, 6.5)]]
    fig, data = pareto_front(pd.DataFrame(rows), "crowded")
    assert data["pareto"].sum() == 7
    assert layout_faults(fig) == []
