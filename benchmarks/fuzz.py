"""Fuzz every command of ``clustersim`` in-process (issue 24, item 9; docs/fuzzing.md).

    python benchmarks/fuzz.py [--cases N] [--seed S]      # long mode (default 10,000 cases)
    python benchmarks/fuzz.py --replay '["simulate", "good.yaml", "--set", "x=1"]'

Each case draws the argument list of ``simulate``, ``plan``, ``sweep``, ``report``,
``collective`` or ``validate --dry-run`` (benchmarks/fuzz_cases.py), runs
``clustersim.cli.main(argv)`` in a fresh working folder, and checks the property:

- the exit status is 0, 1 or 2, and nothing escapes ``main`` (a traceback);
- status 2 ends stderr with one ``error:`` line; no output holds a traceback;
- ``--json`` that succeeds prints strict JSON (no NaN or Infinity);
- nothing is written outside the output paths the argument list names: the working folder
  is compared before and after, and so are the repository's files and the data folder.

Progress goes to stderr; the summary (outcomes by exit status, slowest cases, failures with
the argument list that reproduces them) to stdout. Exit status 1 when any case failed.
tests/cli/test_fuzz_cli.py runs the same check on a few dozen cases.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz_cases  # noqa: E402  (beside this file, not an installed module)

ROOT = fuzz_cases.ROOT
# A case that has used this much CPU time is a hang: reported, then abandoned. CPU time, not
# wall time, so that a loaded machine does not turn slow cases into hangs (a first --seed 3
# run, sharing 2 cores with a test run, failed 7 cases that each replay in under 10 s of CPU).
CASE_LIMIT_S = 60
CASE_WALL_LIMIT_S = 600  # a case that waits without computing (a deadlock) is caught here
SLOW_S = 2.0  # the fuzz keeps its cases under about this; slower ones are listed
# Options whose value is a path the command may write (and create below).
OUTPUT_OPTIONS = {"--out", "--trace", "--timeline", "--plots", "--save-best"}
SKIPPED_IN_REPO = {".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}


@dataclass
class Outcome:
    """One case: its argument list, exit status, seconds and what was wrong (empty: nothing)."""
    argv: list[str]
    status: int | None
    seconds: float
    problems: list[str] = field(default_factory=list)
    last_line: str = ""  # stderr's last line (the error), for --verbose


class CaseTimeout(Exception):
    """A case ran past CASE_LIMIT_S of CPU time (or CASE_WALL_LIMIT_S of wall time)."""


class TimeUp(BaseException):
    """The long mode's --max-seconds ran out: stop drawing cases and summarise."""


def snapshot(folder: Path, skip: set[str] = frozenset()) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: relative path -> (size, modification time in ns); every
    folder -> (-1, 0)."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
        for name in dirnames:  # folders by name only: a file added inside is seen on its own
            files[str(Path(dirpath, name).relative_to(folder))] = (-1, 0)
        for name in filenames:
            path = Path(dirpath, name)
            stat = path.lstat()
            files[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return files


def changed(before: dict, after: dict) -> list[str]:
    """Paths created, changed or removed between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def allowed_prefixes(argv: list[str]) -> list[str]:
    """Relative paths a case may write: each output option's value (and what starts with it,
    e.g. ``out.csv.fingerprint.json``), and the report folder ``report`` names by default.
    ``.`` stands for an output option that names the working folder itself (``--out .``,
    ``--plots ./``); an empty value names nothing."""
    prefixes = []
    for i, arg in enumerate(argv):
        name, _, inline = arg.partition("=")
        if name in OUTPUT_OPTIONS and (inline or i + 1 < len(argv)):
            if argv[0] == "validate":  # a dry run writes nothing, not even --out
                continue
            prefixes.append(inline or argv[i + 1])
    if argv[0] == "report" and len(argv) > 1:
        stem = argv[1].split(".")[0]
        prefixes.append(stem + "-report")
    return [os.path.normpath(p) for p in prefixes if p]


def outside_writes(argv: list[str], written: list[str],
                   existed: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The written paths that no output option of ``argv`` names: an output path, what lies
    in it, its sidecars (``out.csv.fingerprint.json``) and the folders made above it. An
    option naming the working folder (``report t.csv --out .``) lets the case add files
    anywhere in it, but not change or remove one that ``existed`` before (an input)."""
    prefixes = allowed_prefixes(argv)
    whole_folder = "." in prefixes
    prefixes = [p for p in prefixes if p != "."]
    parents = {str(parent) for prefix in prefixes for parent in Path(prefix).parents}
    return [p for p in written
            if p not in parents and not any(_under(p, prefix) for prefix in prefixes)
            and not (whole_folder and p not in existed)]


def _under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix``, inside it, or a sidecar named after it (``prefix.*``); not a
    mere string prefix (``--out rep`` does not name ``report.html``)."""
    return path == prefix or path.startswith((prefix + os.sep, prefix + "."))


def strict_json_problem(text: str) -> str | None:
    """Why ``text`` is not one strict JSON value (RFC 8259: no NaN, no Infinity), or None."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")
    try:
        json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        return f"--json output is not strict JSON: {exc}"
    return None


def _alarm(signum, frame):
    if signum == signal.SIGPROF:
        raise CaseTimeout(f"ran past {CASE_LIMIT_S} s of CPU time")
    raise CaseTimeout(f"ran past {CASE_WALL_LIMIT_S} s")


def call_main(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """``main(argv)`` with stdout and stderr captured: (status, out, err, what escaped)."""
    from clustersim.cli import main

    out, err, escaped, status = io.StringIO(), io.StringIO(), None, None
    previous = {sig: signal.signal(sig, _alarm) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, CASE_LIMIT_S)  # the process's CPU time
    signal.alarm(CASE_WALL_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as exc:  # argparse's --help: a normal, successful exit
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException as exc:  # noqa: BLE001  (a traceback: the failure we look for)
        import traceback
        escaped = "".join(traceback.format_exception(exc)).rstrip()
    finally:
        signal.alarm(0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status, out.getvalue(), err.getvalue(), escaped


def check_outputs(argv: list[str], status, out: str, err: str) -> list[str]:
    """What is wrong with a finished case's exit status and output."""
    problems = []
    if status not in (0, 1, 2):
        problems.append(f"exit status {status!r}, not 0, 1 or 2")
    if "Traceback (most recent call last)" in out + err:
        problems.append("a traceback in the output")
    lines = [line for line in err.splitlines() if line.strip()]
    if status == 2 and not (lines and lines[-1].startswith("error: ")):
        problems.append(f"exit status 2 without a last 'error:' line: {err[-300:]!r}")
    if status == 0 and "--json" in argv and "--help" not in argv and "-h" not in argv:
        problem = strict_json_problem(out)
        if problem:
            problems.append(problem)
    return problems


class Runner:
    """Runs cases, each in a fresh folder under one scratch folder, and keeps the outcomes."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.data_dir = scratch / "data"
        self.data_dir.mkdir(exist_ok=True)
        os.environ["CLUSTERSIM_DATA_DIR"] = str(self.data_dir)
        os.environ.setdefault("MPLBACKEND", "Agg")
        self.tables = fuzz_cases.table_fixtures(scratch / "table")
        self.repo = snapshot(ROOT, SKIPPED_IN_REPO)
        self.outcomes: list[Outcome] = []

    def run(self, argv: list[str]) -> Outcome:
        """One case: fixtures written, ``main`` run in the case folder, the property checked."""
        folder = Path(tempfile.mkdtemp(prefix="case-", dir=self.scratch))
        fuzz_cases.write_fixtures(folder, self.tables)
        before, data_before = snapshot(folder), snapshot(self.data_dir)
        cwd = os.getcwd()
        os.chdir(folder)
        start = time.perf_counter()
        try:
            status, out, err, escaped = call_main(argv)
        finally:
            seconds = time.perf_counter() - start
            os.chdir(cwd)
        problems = [f"escaped main:\n{escaped}"] if escaped else check_outputs(argv, status,
                                                                              out, err)
        stray = outside_writes(argv, changed(before, snapshot(folder)), set(before))
        stray += [f"data folder: {p}" for p in changed(data_before, snapshot(self.data_dir))]
        repo_now = snapshot(ROOT, SKIPPED_IN_REPO)
        stray += [f"repository: {p}" for p in changed(self.repo, repo_now)]
        self.repo = repo_now  # report each stray repository write once
        if stray:
            problems.append(f"wrote outside the paths given: {stray[:5]}")
        outcome = Outcome(argv, status, seconds, problems, (err.strip().splitlines() or [""])[-1])
        self.outcomes.append(outcome)
        return outcome


def summary(outcomes: list[Outcome], wall_s: float) -> str:
    """Outcomes by exit status, the slowest cases and every failure with its argv."""
    by_status = Counter("traceback" if o.status is None else o.status for o in outcomes)
    by_command = Counter(o.argv[0] for o in outcomes)
    failures = [o for o in outcomes if o.problems]
    slow = sorted((o for o in outcomes if o.seconds > SLOW_S), key=lambda o: -o.seconds)
    lines = [f"{len(outcomes)} cases in {wall_s:.0f} s; {len(failures)} failed",
             "by exit status: " + ", ".join(f"{k}: {v}" for k, v in sorted(
                 by_status.items(), key=str)),
             "by command: " + ", ".join(f"{k}: {v}" for k, v in sorted(by_command.items())),
             f"slower than {SLOW_S:g} s: {len(slow)}"]
    lines += [f"  {o.seconds:.1f} s  {json.dumps(o.argv)}" for o in slow[:10]]
    for o in failures:
        lines.append(f"FAILED (status {o.status}): {json.dumps(o.argv)}")
        lines += ["    " + line for p in o.problems for line in p.splitlines()[-12:]]
    return "\n".join(lines)


def run_cases(cases: int, seed: int, progress_every: int = 100, verbose: bool = False,
              max_seconds: float = float("inf")) -> list[Outcome]:
    """``cases`` argument lists drawn by hypothesis from ``seed``, every one run and kept
    (no shrinking: a failure is reported with the argument list that showed it); fewer when
    ``max_seconds`` run out or on Ctrl-C."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-") as scratch:
        runner = Runner(Path(scratch))
        start = time.monotonic()

        @hypothesis_seed(seed)
        @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(fuzz_cases.argv_strategy())
        def one(argv):
            if time.monotonic() - start > max_seconds:
                raise TimeUp
            outcome = runner.run(argv)
            done = len(runner.outcomes)
            if verbose:
                print(f"{outcome.status} {outcome.seconds:.2f}s {json.dumps(argv)}\n    "
                      f"{outcome.last_line}", file=sys.stderr)
            if outcome.problems:
                print(f"FAILED: {json.dumps(argv)}", file=sys.stderr)
            if done % progress_every == 0:
                failed = sum(bool(o.problems) for o in runner.outcomes)
                print(f"{done} cases, {failed} failed, {time.monotonic() - start:.0f} s",
                      file=sys.stderr)

        try:
            one()
        except (TimeUp, KeyboardInterrupt):
            print("stopped early", file=sys.stderr)
        return runner.outcomes


def replay(argv: list[str]) -> int:
    """One argument list, run as the fuzz runs it, with its output shown."""
    with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-") as scratch:
        runner = Runner(Path(scratch))
        folder = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
        fuzz_cases.write_fixtures(folder, runner.tables)
        os.chdir(folder)
        status, out, err, escaped = call_main(argv)
        os.chdir(ROOT)
        print(out + err + (escaped or ""))
        print(f"exit status {status}")
        return 0 if status in (0, 1, 2) and not escaped else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases to run")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument("--max-seconds", type=float, default=float("inf"),
                        help="stop drawing cases after this long and summarise")
    parser.add_argument("--verbose", action="store_true", help="print every case")
    parser.add_argument("--replay", metavar="JSON", help="run one argv (a JSON list)")
    args = parser.parse_args()
    if args.replay:
        return replay(json.loads(args.replay))
    start = time.monotonic()
    outcomes = run_cases(args.cases, args.seed, verbose=args.verbose,
                         max_seconds=args.max_seconds)
    print(summary(outcomes, time.monotonic() - start))
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
