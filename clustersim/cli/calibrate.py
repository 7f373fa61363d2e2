"""``clustersim calibrate``: measure this machine and write its calibration profile."""

from __future__ import annotations

import argparse
import sys

from clustersim.errors import ScenarioError
from clustersim.reports.paths import check_file_output


def add_calibrate(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "calibrate", help="measure GEMMs, memory-bound ops and collectives; write a profile",
        description="Run microbenchmarks on NPROC ranks at once (GEMMs of transformer shapes, "
                    "element-wise kernels, the optimizer step, all-reduce / all-gather / "
                    "send-recv over message sizes), fit the cost model's efficiencies and "
                    "per-tier alpha-beta, and write a profile JSON with the raw measurements "
                    "beside it (same name, .raw.csv). Takes one to two minutes on 2 CPU cores.")
    cmd.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                     help="gloo: CPU processes (default); nccl: one process per GPU")
    cmd.add_argument("--nproc", type=int, default=None,
                     help="ranks to measure with (default: 2 CPU processes, or every GPU)")
    cmd.add_argument("--out", metavar="PROFILE.json", default=None,
                     help="where to write (default: a new <device>-<time>.json in the user "
                          "data folder, $CLUSTERSIM_DATA_DIR/profiles if set; 'validate' reads "
                          "the newest there)")
    cmd.add_argument("--quick", action="store_true",
                     help="small shapes only: a smoke test, not a usable calibration (marked "
                          "\"quick\" in the profile; validate uses it only when named)")
    cmd.set_defaults(run=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from clustersim.validation import machine, profiles
    from clustersim.validation.calibration_run import calibrate, raw_path
    from clustersim.validation.noise import NOISY_ROUNDS, round_noise

    machine.require_torch()
    nproc = args.nproc if args.nproc is not None else (
        2 if args.backend == "gloo" else machine.default_nproc(args.backend))
    machine.check_backend(args.backend, nproc)
    if args.out:
        out = check_file_output("--out", args.out)
        if out.suffix != ".json":
            raise ScenarioError("--out", f"expected a .json file name, got {str(out)!r}")
    else:
        out = profiles.new_calibration_path(machine.device(args.backend))
        out.parent.mkdir(parents=True, exist_ok=True)
    if profiles.is_shipped(out):
        raise ScenarioError("--out", "the installed package's profiles are not written; give "
                                     "another file, or leave --out out for the user folder")
    profile, rows = calibrate(args.backend, nproc, args.quick, out)
    use = (f"a --quick smoke test, which validate uses only when named: --profile {out.stem}"
           if args.quick else f"validate --profile {out.stem} uses it")
    print(f"wrote {out} (raw: {raw_path(out).name}, {len(rows)} measurements); {use}")
    _print_summary(profile)
    noise = round_noise(rows)
    if noise > NOISY_ROUNDS:
        print(f"warning: kernel timings varied by {noise:.0%} between rounds (median): this "
              "machine was busy; calibrate again when it is quiet", file=sys.stderr)
    return 0


def _print_summary(profile) -> None:
    effs = [e for _, table in profile.matmul_efficiency_by_tokens for _, e in table]
    print(f"  matmul efficiency     {min(effs):.2f} .. {max(effs):.2f} of peak "
          f"({len(profile.matmul_efficiency_by_tokens)} token counts)")
    print(f"  memory efficiency     {profile.memory_efficiency:.3f}")
    print(f"  optimizer efficiency  {profile.optimizer_eff:.3f}")
    for tier, eff in profile.comm_efficiency.items():
        alpha = profile.comm_latency_s.get(tier, 0.0)
        print(f"  {tier:<21} {eff:.3f} of line rate, alpha {alpha * 1e6:.1f} us")
