"""Regenerate, or check, the command outputs the README and docs/ print.

A fenced block preceded by ``<!-- output -->`` holds commands (lines starting ``$ clustersim``,
``$ sh examples/...`` for a shipped script, ``$ python3 benchmarks/...`` or
``$ python3 examples/...``) each followed by what it prints;
``<!-- output grep=REGEX -->`` keeps only the printed lines that match. This script reruns
every such command (in a subprocess, 200 columns wide, from the repository's root) and
rewrites its output, so no printed figure drifts from the code:

    python3 benchmarks/doc_outputs.py            # list the blocks that are stale
    python3 benchmarks/doc_outputs.py --write    # rewrite them

tests/test_doc_outputs.py fails when a block is stale.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- output(?: grep=(?P<grep>\S+))? -->\n```\n(?P<body>.*?)```", re.S)
FILES = ("README.md", "docs/*.md")


@dataclass(frozen=True)
class Block:
    """One marked block of one file: where it sits and what it says now."""

    path: Path
    start: int  # offsets of the block's body in the file
    end: int
    body: str
    grep: str | None

    def commands(self) -> list[str]:
        return [line[2:] for line in self.body.splitlines()
                if line.startswith(("$ clustersim ", "$ sh examples/", "$ python3 benchmarks/",
                                    "$ python3 examples/"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(path, m.start("body"), m.end("body"), m.group("body"), m.group("grep"))
            for m in BLOCK.finditer(text)]


@cache  # README and docs/ print some commands twice
def run(command: str, scratch: Path | None = None) -> str:
    """What ``command`` prints (stdout), run as a user would from the repository's root, or a
    shipped script from ``scratch`` so that the files it writes land there (a check must not
    rewrite the plots a script ships)."""
    args = shlex.split(command)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cwd = ROOT
    if args[0] == "sh":
        args = ["sh", str(ROOT / args[1]), *args[2:]]
        cwd = scratch or ROOT
    elif args[0] == "python3":
        args = [sys.executable, str(ROOT / args[1]), *args[2:]]
    else:
        args = [sys.executable, "-m", "clustersim", *args[1:]]
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{command}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def render(block: Block, scratch: Path | None = None) -> str:
    """The block's body with every command's output as it prints now."""
    out = []
    for command in block.commands():
        lines = [line.rstrip() for line in run(command, scratch).rstrip("\n").splitlines()]
        if block.grep:
            lines = [line for line in lines if re.search(block.grep, line)]
        out += [f"$ {command}", *lines]
    return "\n".join(out) + "\n"


def marked_files() -> list[Path]:
    return sorted({p for pattern in FILES for p in ROOT.glob(pattern) if BLOCK.search(
        p.read_text(encoding="utf-8"))})


def stale_blocks(scratch: Path | None = None) -> list[tuple[Block, str]]:
    """Every marked block whose printed output differs from a fresh run, with the fresh body;
    shipped scripts run in ``scratch`` when given (a check), else in the root (a rewrite)."""
    stale = []
    for path in marked_files():
        for block in blocks(path):
            fresh = render(block, scratch)
            if fresh != block.body:
                stale.append((block, fresh))
    return stale


def write(stale: list[tuple[Block, str]]) -> None:
    by_file: dict[Path, list[tuple[Block, str]]] = {}
    for block, fresh in stale:
        by_file.setdefault(block.path, []).append((block, fresh))
    for path, items in by_file.items():
        text = path.read_text(encoding="utf-8")
        for block, fresh in sorted(items, key=lambda item: -item[0].start):
            text = text[:block.start] + fresh + text[block.end:]
        path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stale blocks")
    a = ap.parse_args(argv)
    if a.write:
        stale = stale_blocks()
    else:
        with tempfile.TemporaryDirectory() as scratch:
            stale = stale_blocks(Path(scratch))
    for block, _ in stale:
        print(f"stale: {block.path.relative_to(ROOT)}: {'; '.join(block.commands())}")
    if a.write and stale:
        write(stale)
        print(f"rewrote {len(stale)} block(s)")
    return 1 if stale and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
