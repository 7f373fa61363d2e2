"""Exit codes and names (issue 24, item 7): a plan with nothing that fits exits non-zero, a
misspelled key is named with the key it was meant to be, every file a ``--help`` text points to
exists, and ``presets`` in a pipe prints every name whole."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from cli_helpers import run

from clustersim.cli import build_parser
from clustersim.simulator.inputs.scenario import load_scenario
from clustersim.simulator.model.param_counts import total_params
from clustersim.topologies.hardware import cluster_presets, gpu_presets

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3-70b-h100.yaml"


# --- plan: nothing fits --------------------------------------------------------------------------

NO_FIT = ["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8",
          "--fix", "parallel.tp=8"]


def test_llama3_405b_cannot_fit_on_8_h100s_by_the_16_bytes_per_parameter_rule():
    """The oracle: mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al. 2020,
    ZeRO, section 3.1); even sharded over all 8 GPUs that is more than one GPU holds."""
    s = load_scenario(str(EXAMPLE), ["model.preset=llama3-405b"])
    per_gpu = 16 * total_params(s.model) / 8
    assert per_gpu > gpu_presets()["h100-sxm"]["memory_bytes"]


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_a_plan_with_nothing_that_fits_exits_1(capsys, json_flag):
    code, out, err = run(capsys, *NO_FIT, *json_flag)
    assert code == 1
    if json_flag:
        assert json.loads(out) == []  # stdout stays exactly one JSON array
        assert err.startswith("No split fits")
    else:
        assert out.startswith("No split fits")


def test_a_plan_that_fits_still_exits_0(capsys):
    code, out, err = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                         "--gpus", "8", "--fix", "parallel.tp=8", "--top", "1", "--json")
    assert code == 0, err
    assert len(json.loads(out)) == 1


# --- misspelled keys -----------------------------------------------------------------------------

TYPOS = [  # (the line of examples/llama3-70b-h100.yaml, its misspelling, the field named)
    ("  global_batch:", "  global_bacth:", "training.global_bacth", "global_batch"),
    ("  tp:", "  tpp:", "parallel.tpp", "tp"),
    ("training:", "trainnig:", "trainnig", "training"),
    ("  zero:", "  zeros:", "parallel.zeros", "zero"),
]


@pytest.mark.parametrize("line, typo, field, meant", TYPOS, ids=[t[2] for t in TYPOS])
def test_a_misspelled_key_is_named_with_the_key_it_was_meant_to_be(capsys, tmp_path, line,
                                                                   typo, field, meant):
    text = EXAMPLE.read_text()
    assert text.count(f"\n{line}") == 1
    path = tmp_path / "typo.yaml"
    path.write_text(text.replace(f"\n{line}", f"\n{typo}"))
    code, out, err = run(capsys, "simulate", str(path))
    assert (code, out, len(err.splitlines())) == (2, "", 1), err
    assert err.startswith(f"error: {field}: unknown key; did you mean {meant!r}?")


@pytest.mark.parametrize("override, field, meant", [
    ("cluster.inter_node.bandwdith=50", "cluster.inter_node.bandwdith", "bandwidth"),
    ("cluster.gpu.peak_flop=1", "cluster.gpu.peak_flop", "peak_flops"),
    ("model.hiden=1024", "model.hiden", "hidden"),
])
def test_a_misspelled_nested_key_is_named_too(capsys, override, field, meant):
    code, _, err = run(capsys, "simulate", str(EXAMPLE), "--set", override)
    assert code == 2 and err.startswith(f"error: {field}: unknown key; did you mean {meant!r}?")


def test_a_misspelled_profile_key_is_named(capsys, tmp_path):
    data = json.loads((ROOT / "topologies/profiles/h100-sxm.json").read_text())
    data["gemm"]["ceilling"] = data["gemm"].pop("ceiling")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "simulate", str(EXAMPLE), "--profile", str(path))
    assert code == 2
    assert err.startswith("error: profile.gemm.ceilling: unknown key; did you mean 'ceiling'?")


# --- files named in --help -----------------------------------------------------------------------

def _help_texts() -> dict[str, str]:
    parser = build_parser()
    texts = {"clustersim": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts.update((name, sub.format_help()) for name, sub in action.choices.items())
    return texts


def _file_references(text: str) -> set[str]:
    """Paths into the repository a help text names: a word with a folder and an extension
    (``docs/planner.md``), or a Markdown file (``SCENARIO.md``); not URLs, and not
    placeholders such as ``PROFILE.json`` (no folder, not a document)."""
    words = (w.strip(".,;:()'\"") for w in text.split())
    return {w for w in words if "://" not in w and not w.startswith("//")
            and (re.fullmatch(r"[\w.-]+(/[\w.-]+)+\.\w+", w) or re.fullmatch(r"[\w.-]+\.md", w))}


def test_every_file_a_help_text_points_to_exists(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens: keep every path whole
    texts = _help_texts()
    assert {"simulate", "sweep", "plan", "report", "calibrate", "validate", "collective",
            "presets"} <= set(texts)
    named = {(command, ref) for command, text in texts.items() for ref in _file_references(text)}
    assert ("simulate", "docs/scenario.md") in named  # the scenario format
    assert ("validate", "docs/calibration.md") in named  # its --json object
    missing = [(command, ref) for command, ref in named if not (ROOT / ref).is_file()]
    assert not missing


# --- presets in a pipe ---------------------------------------------------------------------------

def test_presets_in_a_pipe_prints_every_name_whole(capsys):
    """capsys is not a terminal, as a pipe is not: rich would assume 80 columns and cut the
    longest names ("deepseek-moe-…")."""
    code, out, _ = run(capsys, "presets", "--json")
    rows = json.loads(out)
    names = {r["name"] for section in rows.values() for r in section}
    assert set(cluster_presets()) <= names and set(gpu_presets()) <= names
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "…" not in out
    cells = {cell.strip() for line in out.splitlines() for cell in line.split("│")}
    assert names <= cells
