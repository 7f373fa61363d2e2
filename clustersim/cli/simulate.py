"""``clustersim simulate``: predict one scenario's step time, its breakdown and per-GPU memory
(with fit hints when it does not fit, and error bars with ``--samples``)."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_file_output

from .json_output import print_json
from .profile_args import add_profile_arguments, chosen_profile, note_generic_profile


def add_simulate(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "simulate", help="predict step time and memory of one scenario",
        description="Predict step time, its breakdown and per-GPU memory of a scenario file "
                    "(format: docs/scenario.md).")
    cmd.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    cmd.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="PATH=VALUE",
                     help="override a field, e.g. --set parallel.tp=4 (repeatable)")
    cmd.add_argument("--json", action="store_true", help="print the JSON result instead of tables")
    cmd.add_argument("--fidelity", choices=["representative", "full", "analytic"],
                     default="representative",
                     help="representative (default): the discrete-event engine on one pipeline, "
                          "peers collapsed; full: every rank and link, for contention "
                          "(clusters up to ~1K GPUs); analytic: the closed-form estimate")
    cmd.add_argument("--trace", metavar="FILE",
                     help="write the step's timeline as Chrome trace-event JSON "
                          "(open in https://ui.perfetto.dev); engine fidelities only")
    cmd.add_argument("--timeline", metavar="FILE.png",
                     help="draw the step's pipeline timeline (each rank's forwards, backwards "
                          "and communication) to a PNG or SVG; engine fidelities only")
    add_profile_arguments(cmd, "the shipped one for the cluster's GPU")
    cmd.add_argument("--samples", type=int, metavar="N",
                     help="also predict the step under N draws of the profile's uncertainty "
                          "and report the median and 90%% interval (N runs' time)")
    cmd.add_argument("--seed", type=int, default=0,
                     help="seed of the --samples draws (default 0: the same interval each run)")
    cmd.set_defaults(run=run_simulate)


FULL_FIDELITY_WARN_GPUS = 2048
PROGRESS_AFTER_S = 2.0  # a simulation shorter than this shows no bar


@contextmanager
def simulation_progress() -> Iterator[None]:
    """A progress bar on stderr, if it is a terminal, for simulations that outlast
    ``PROGRESS_AFTER_S``: the ranks' actions run out of all they will run, per simulation."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn

    from clustersim.simulator.discrete_event.progress import listening

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    started, shown = time.monotonic(), {}

    def update(done: int, total: int) -> None:
        if not shown and time.monotonic() - started < PROGRESS_AFTER_S:
            return
        if not shown:
            shown["bar"] = Progress("simulating", BarColumn(), TaskProgressColumn(),
                                    console=console, transient=True)
            shown["bar"].start()
            shown["task"] = shown["bar"].add_task("step", total=total)
        shown["bar"].update(shown["task"], completed=done, total=total)

    try:
        with listening(update):
            yield
    finally:
        if shown:
            shown["bar"].stop()


def _note_full_size(s) -> None:
    """Say so when full fidelity has many ranks to simulate (every GPU, or one per TP group
    when the peers are alike: ``simulator/network/symmetry.py``)."""
    from clustersim.simulator.network.symmetry import tp_width

    ranks = s.cluster.gpus // tp_width(s)
    if ranks > FULL_FIDELITY_WARN_GPUS:
        print(f"note: full fidelity simulates {ranks} ranks of {s.cluster.gpus} GPUs; this may "
              "take minutes (representative is the fast default)", file=sys.stderr)


def run_simulate(args: argparse.Namespace) -> int:
    from clustersim.reports.simulation import run_simulation
    from clustersim.simulator.inputs.pool_rules import check_fidelity
    from clustersim.simulator.inputs.scenario import build_scenario, raw_scenario

    _check_trace(args)
    _check_timeline(args)
    raw, name = raw_scenario(args.scenario, args.overrides)
    profile = chosen_profile(args)  # checked against the cluster's GPU in run_simulation
    if args.fidelity == "full":
        scenario = build_scenario(raw, name)
        check_fidelity(scenario, "full")  # before sizing it: full fidelity refuses pools
        _note_full_size(scenario)
    with simulation_progress():
        sim = run_simulation(raw, name, args.fidelity, profile, trace=args.trace,
                             samples=args.samples, seed=args.seed,
                             force_profile=args.force_profile)
    if args.timeline:
        from clustersim.reports.figures import write_timeline
        write_timeline(sim.scenario, args.fidelity, profile, Path(args.timeline))
        print(f"wrote {args.timeline}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json(sim.to_dict())
    else:
        from clustersim.reports.hints import hint_lines
        from clustersim.reports.tables import print_result
        print_result(sim.scenario, sim.result)
        note_generic_profile(sim.scenario.cluster, profile)
        if sim.spread is not None:
            print(spread_line(sim.spread))
        for line in hint_lines(sim.fit_hints) if not sim.fits else []:
            print(line)
        _note_moe(sim.scenario)
    return 0


def _note_moe(s) -> None:
    """What the held-out MoE runs say of an MoE scenario (reports/plan_caveats.py), on
    stderr beside the other notes on how far to trust the numbers."""
    from clustersim.reports.plan_caveats import moe_routing_note

    note = moe_routing_note(s, "note: this scenario")
    if note:
        print("\n".join(textwrap.wrap(note, 80)), file=sys.stderr)


def spread_line(spread) -> str:
    """One line for ``--samples``: the median step and its 90% interval."""
    lo, median, hi = spread.step_time_s
    line = (f"step time {median:.4g} s, 90% interval {lo:.4g}-{hi:.4g} s "
            f"({spread.samples} draws of the profile's uncertainty, seed {spread.seed})")
    if spread.time_to_train_s is not None:
        days = [t / 86400 for t in spread.time_to_train_s]
        line += f"; time to train {days[1]:.1f} days ({days[0]:.1f}-{days[2]:.1f})"
    if not spread.drawn:
        line += "; the profile states no uncertainty, so the interval has no width"
    elif not any(name.startswith(COMPUTE_FIGURES) for name in spread.drawn):
        line += (f"\nnote: only {', '.join(spread.drawn)} carried a spread; the profile states "
                 "none for its compute figures, so this interval is not the model's error "
                 "(held-out runs: docs/accuracy.md)")
    return line


# Profile figures that price compute; a spread drawn without any of them leaves compute fixed.
COMPUTE_FIGURES = ("gemm.", "matmul_efficiency", "attention_efficiency")


def _check_trace(args: argparse.Namespace) -> None:
    """``--trace`` needs the engine and a folder to write into; checked before simulating."""
    if not args.trace:
        return
    if args.fidelity == "analytic":
        raise ScenarioError("--trace", "the analytic estimate has no timeline; use "
                                       "--fidelity representative or full")
    check_file_output("--trace", args.trace)


def _check_timeline(args: argparse.Namespace) -> None:
    """``--timeline`` needs the engine, a picture format and a folder to write into."""
    if not args.timeline:
        return
    if args.fidelity == "analytic":
        raise ScenarioError("--timeline", "the analytic estimate has no timeline; use "
                                          "--fidelity representative or full")
    if Path(args.timeline).suffix.lower() not in (".png", ".svg"):
        raise ScenarioError("--timeline", f"{args.timeline!r}: give a .png or .svg file")
    check_file_output("--timeline", args.timeline)
