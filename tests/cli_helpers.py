"""Running the command line in-process, as the CLI tests do (here, beside conftest.py, so that
every test folder can import it)."""

from __future__ import annotations

from clustersim.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``clustersim ARGV``: (exit status, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
