"""The ``clustersim`` command line: one module per command, each thin (parse its flags, call
the library, format what it returns), and this shell that gathers them and turns bad input
into one ``error:`` line.

Bad input of any kind ends with one ``error: <field>: <why>`` line on stderr and exit status 2
(SCENARIO.md); results go to stdout, so ``--json`` output is exactly one JSON object. Each
command imports what it needs (pandas, matplotlib, rich, Ray, torch) inside the function that
runs it, so that importing the command line stays cheap (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from clustersim import __version__
from clustersim.errors import ScenarioError
from clustersim.plugins import load_plugins

from .calibrate import add_calibrate
from .collective import add_collective
from .plan import add_plan
from .presets import add_presets
from .report import add_report
from .simulate import add_simulate
from .sweep import add_sweep
from .validate import add_validate

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
EXIT_BROKEN_PIPE = 1  # as Python's SIGPIPE recipe and rich


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage mistakes as one ``error:`` line, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScenarioError("", f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="clustersim", description=(
        "Simulate distributed LLM training: step time, its breakdown and per-GPU memory "
        "for a model split over a GPU cluster."))
    parser.add_argument("--version", action="version", version=f"clustersim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                     metavar="COMMAND")
    add_simulate(commands)
    add_sweep(commands)
    add_plan(commands)
    add_report(commands)
    add_calibrate(commands)
    add_validate(commands)
    add_collective(commands)
    add_presets(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    try:
        status = _run(argv)
        sys.stdout.flush()  # a reader gone shows here, while it can still be caught
        return status
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """stdout's reader closed the pipe (``clustersim presets --json | head -1``): stop
    quietly, by Python's recipe (docs.python.org/3/library/signal.html, "Note on SIGPIPE"):
    point stdout at devnull so that the interpreter's last flush does not fail again, and
    exit 1, as rich does for its tables (``Console.on_broken_pipe``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (tests capture it)
        pass
    return EXIT_BROKEN_PIPE


def _run(argv: Sequence[str] | None) -> int:
    """Parse and run one command; bad input and failed real runs as one ``error:`` line."""
    try:
        load_plugins()  # what installed plugins register is seen by the parser's choices
        args = build_parser().parse_args(argv)
        return args.run(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        if type(exc).__name__ != "RankFailure":  # a real run's rank failed (validation/launch)
            raise
        lines = [line for line in str(exc).splitlines() if line.strip()]
        why = lines[0] + (f" {lines[-1].strip()}" if len(lines) > 1 else "")
        print(f"error: real run failed: {why}", file=sys.stderr)
        return EXIT_RUN_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
