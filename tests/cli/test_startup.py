"""Start-up: the command line imports the heavy libraries only in the commands that use them
(issue 12). A behaviour test on what gets imported, not a timing test; the timing is
benchmarks/startup.py."""

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-h100.yaml"
HEAVY = ("matplotlib", "pandas", "torch", "ray")
# The planner's modules and numpy: the plan and collective commands, a split backward's memory
# and full fidelity's flows import them where they run, so that the command line and a
# representative step start without them (each about a tenth of a second).
PLANNER = ("clustersim.reports.plan", "clustersim.reports.plan_request",
           "clustersim.reports.plan_search", "numpy")


def _loaded_after(code: str, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``watched`` modules in sys.modules after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def test_importing_the_cli_loads_no_heavy_library():
    assert _loaded_after("import clustersim.cli") == []


def test_simulate_loads_no_heavy_library():
    code = ("import contextlib, io\nfrom clustersim.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['simulate', {str(EXAMPLE)!r}]) == 0")
    assert _loaded_after(code) == []


def test_importing_the_cli_or_simulating_loads_no_planner_nor_numpy():
    assert _loaded_after("import clustersim.cli", PLANNER) == []
    code = ("import contextlib, io\nfrom clustersim.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['simulate', {str(EXAMPLE)!r}]) == 0")
    assert _loaded_after(code, PLANNER) == []


def test_the_probe_sees_a_planner_import():
    assert _loaded_after("import clustersim.reports.plan", PLANNER)[:1] == [
        "clustersim.reports.plan"]


def test_the_probe_sees_a_heavy_import():
    # the oracle of the two tests above: the same probe reports pandas once it is imported
    assert _loaded_after("import pandas") == ["pandas"]


def test_printing_a_plan_loads_no_heavy_library():
    # the ranked table names each split (reports/labels.py) without matplotlib or pandas
    code = ("import contextlib, io\nfrom clustersim.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['plan', '--model', 'llama2-7b', '--cluster', 'dgx-h100',"
            " '--gpus', '16', '--jobs', '1']) == 0")
    assert _loaded_after(code) == []
