"""``clustersim validate``: run a scenario for real, shrunk to this machine, against its
prediction."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_file_output

from .json_output import print_json
from .profile_args import add_profile_arguments

RUN_TIMEOUT_S = 900


def add_validate(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "validate", help="run a scenario for real (shrunk to this machine) vs its prediction",
        description="Shrink SCENARIO to what this machine can run, keeping its TP/CP/PP split, "
                    "schedule and ZeRO stage; train it for real with torch.distributed; predict "
                    "the same run with the calibrated profile; print predicted vs measured step "
                    "time and peak memory with the error in percent.")
    cmd.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    cmd.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="PATH=VALUE", help="override a field first (repeatable)")
    cmd.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                     help="gloo: CPU processes (default); nccl: one process per GPU")
    cmd.add_argument("--nproc", type=int, default=None,
                     help="ranks to run (default: the scenario's tp x cp x pp x dp, capped to "
                          "this machine)")
    cmd.add_argument("--steps", type=int, default=6,
                     help="training steps; the first is warm-up and not timed (default 6)")
    add_profile_arguments(cmd, "this device's newest calibration, not a --quick one, else "
                               "the shipped profile")
    cmd.add_argument("--out", metavar="DIR",
                     help="also write the measurements there: validate.json and "
                          "steps.csv (one row per rank and step: step time, time per phase, "
                          "bytes held)")
    cmd.add_argument("--json", action="store_true",
                     help="print the comparison as one JSON object (docs/calibration.md)")
    cmd.add_argument("--dry-run", action="store_true",
                     help="check the inputs, shrink the scenario and predict it, but train "
                          "nothing: print the run that would be made")
    cmd.set_defaults(run=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    from clustersim.simulator.inputs.scenario import load_scenario
    from clustersim.topologies.profile import check_device, load_profile
    from clustersim.validation import machine, profiles
    from clustersim.validation.noise import spread_warning
    from clustersim.validation.shrink import shrink

    if args.steps < 2:
        raise ScenarioError("--steps", f"needs at least 2 (one warm-up), got {args.steps}")
    if args.out:
        check_file_output("--out", args.out)
    scenario = load_scenario(args.scenario, args.overrides)
    if scenario.parallel.stage_pools is not None:
        raise ScenarioError("cluster.pools", "the real-run harness runs on one machine's "
                                             "devices; validate one pool's scenario instead")
    _check_harness_runs(scenario)
    machine.require_torch()
    if args.backend == "nccl":
        machine.check_backend("nccl", 1)  # before looking for the GPU's profile
    if args.profile:
        profile_path, where = profiles.find_profile(args.profile), "--profile"
    else:
        profile_path, where = profiles.default_profile(machine.device(args.backend))
    if not profile_path.is_file():
        raise ScenarioError("--profile", f"no calibration profile at {str(profile_path)!r}; "
                                         f"run 'clustersim calibrate --backend {args.backend}' "
                                         "first")
    profile = load_profile(profile_path)
    shrunk, notes = shrink(scenario, args.backend, args.nproc)
    check_device(profile, shrunk.cluster, args.force_profile)
    nproc = shrunk.cluster.gpus
    machine.check_backend(args.backend, nproc)
    log = sys.stderr
    quick = "; a --quick calibration: a smoke test, not a usable one" if profile.quick else ""
    print(f"validate: profile {profile_path} ({where}{quick})", file=log)
    for note in notes:
        print(f"shrunk {note}", file=log)
    if args.dry_run:
        return _dry_run(shrunk, args, nproc, profile, profile_path)
    report = _compare(shrunk, args, nproc, profile, log)
    report["profile"] = {"name": profile.name, "file": str(profile_path), "quick": profile.quick}
    warning = spread_warning(report["measured"], args.steps)
    if warning:
        print(warning, file=log)
    if args.out:
        _save(Path(args.out), report)
    if args.json:
        print_json({k: v for k, v in report.items() if k != "per_rank"})
    else:
        _print_table(shrunk, report, profile_path)
    return 0


def _dry_run(shrunk, args, nproc: int, profile, profile_path: Path) -> int:
    """``--dry-run``: the shrunk run and its prediction, every input checked as for a real
    run, and nothing trained or written (docs/fuzzing.md drives it)."""
    from clustersim.validation.compare import predict

    predicted = predict(shrunk, profile)
    run = {"dry_run": True, "scenario": shrunk.as_dict(), "backend": args.backend,
           "nproc": nproc, "steps": args.steps,
           "predicted": {"step_time_s": predicted.step_time_s,
                         "breakdown_s": predicted.breakdown.as_dict()},
           "profile": {"name": profile.name, "file": str(profile_path),
                       "quick": profile.quick}}
    if args.json:
        print_json(run)
    else:
        print(f"validate --dry-run: would train {args.steps} steps of {shrunk.name} on {nproc} "
              f"{args.backend} ranks (predicted {predicted.step_time_s:.3f} s a step); "
              "nothing run")
    return 0


def _check_harness_runs(scenario) -> None:
    """The harness builds one copy of the model per pipeline (``validation/train.py``); a
    schedule whose ranks hold two (DualPipe) would run wrongly, so it is refused."""
    from clustersim.simulator.pipeline.stages import scenario_layout

    copies = scenario_layout(scenario).copies
    if copies > 1:
        raise ScenarioError(
            "parallel.schedule", f"the validation harness runs one copy of the model per "
            f"pipeline; {scenario.parallel.schedule} holds {copies} (try dualpipev, its "
            f"one-copy half)")


def _compare(shrunk, args, nproc: int, profile, log) -> dict:
    from clustersim.validation.compare import Measurement, comparison, predict, run_config
    from clustersim.validation.launch import run_ranks
    from clustersim.validation.train import train

    predicted = predict(shrunk, profile)
    cfg = run_config(shrunk, args.steps, args.backend)
    print(f"validate: training {args.steps} steps on {nproc} {args.backend} ranks "
          f"(predicted {predicted.step_time_s:.2f} s a step) ...", file=log)
    start = time.monotonic()
    results = run_ranks(train, nproc, cfg, timeout=RUN_TIMEOUT_S, backend=args.backend)
    print(f"validate: ran in {time.monotonic() - start:.0f} s", file=log)
    measured = Measurement.of(results)
    return {**comparison(shrunk, args.backend, nproc, predicted, measured),
            "per_rank": measured.per_rank}


def _save(folder: Path, report: dict) -> None:
    import pandas as pd

    from clustersim.simulator.discrete_event.timeline import write_json_atomically

    folder.mkdir(exist_ok=True)
    write_json_atomically(folder / "validate.json", report)
    rows = [{"rank": r["rank"], "stage": r["stage"], "step": i, "step_time_s": t,
             **{f"{k}_s": v for k, v in r["phases_s"][i].items()},
             **{f"{k}_bytes": r[k] for k in ("params", "grads", "optimizer", "activations")}}
            for r in report["per_rank"] for i, t in enumerate(r["step_times_s"])]
    tmp = folder / ".steps.csv.tmp"
    pd.DataFrame(rows).to_csv(tmp, index=False)
    tmp.replace(folder / "steps.csv")


def _print_table(shrunk, report: dict, profile_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from clustersim.simulator.model.param_counts import total_params

    p = shrunk.parallel
    console = Console()
    params = total_params(shrunk.model) / 1e6
    m = shrunk.model
    moe = f" ep={p.ep} ({m.experts} experts, top-{m.top_k})" if m.experts > 1 else ""
    cp = f" cp={p.cp} ({p.cp_comm})" if p.cp > 1 else ""
    console.print(f"[bold]{shrunk.name}[/bold]: {params:.{0 if params >= 10 else 1}f}M "
                  f"parameters, tp={p.tp}{cp} pp={p.pp} dp={p.dp}{moe} zero={p.zero} "
                  f"{p.schedule}, "
                  f"{shrunk.microbatches} micro-batches, {report['backend']} x "
                  f"{report['nproc']} (profile {profile_path.name})")
    table = Table("", "predicted", "measured", "error")
    pred, meas, err = report["predicted"], report["measured"], report["error"]
    table.add_row("step time", f"{pred['step_time_s']:.3f} s",
                  f"{meas['step_time_s']:.3f} s ± {meas['step_time_spread_s'] / 2:.3f}",
                  f"{err['step_time']:+.1%}")
    table.add_row("peak memory", f"{pred['peak_bytes'] / 2**20:.0f} MiB",
                  f"{meas['peak_bytes'] / 2**20:.0f} MiB", f"{err['peak_bytes']:+.1%}")
    console.print(table)
    b = pred["breakdown_s"]
    console.print("  predicted breakdown: " + ", ".join(f"{k} {v:.3f} s" for k, v in b.items()))
    console.print("  measured phases (slowest rank): " + ", ".join(
        f"{k} {v:.3f} s" for k, v in meas["phases_s"].items()))
