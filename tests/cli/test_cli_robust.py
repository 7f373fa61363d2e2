"""Inputs that are not UTF-8, readers that close the pipe, and numbers JSON cannot hold: each
command answers with one ``error:`` line, a quiet exit, or strict JSON (issue 24, items 2-3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run

from clustersim.cli.json_output import print_json
from clustersim.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[2]
GOOD = """\
model: {preset: gpt-1.7b}
cluster: {preset: dgx-a100-80gb, gpus: 8}
training: {global_batch: 64, micro_batch: 1, tokens: 3.0e11}
parallel: {tp: 1, pp: 1, dp: 8}
"""
LATIN1 = "name: caf\xe9\n".encode("latin-1")  # a file saved as Latin-1: 0xe9 is not UTF-8


def strict_json(text: str):
    """JSON as RFC 8259 defines it: Python's parser would read NaN and Infinity."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def one_error_line(code: int, out: str, err: str) -> str:
    assert (code, out) == (2, ""), err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    good, bad, profile = tmp_path / "good.yaml", tmp_path / "latin1.yaml", tmp_path / "p.json"
    good.write_text(GOOD)
    bad.write_bytes(LATIN1)
    profile.write_bytes(b'{"name": "caf\xe9"}')
    config = tmp_path / "hf" / "config.json"
    config.parent.mkdir()
    config.write_bytes(b'{"model_type": "llama", "name": "caf\xe9"}')
    hf = tmp_path / "hf.yaml"
    hf.write_text(GOOD.replace("{preset: gpt-1.7b}", "{hf_config: hf/config.json}"))
    return {"GOOD": good, "BAD": bad, "PROFILE": profile, "HF": hf, "CONFIG": config}


NOT_UTF8 = {  # command line, with the file it must name
    "simulate": (["simulate", "BAD"], "BAD"),
    "simulate-hf-config": (["simulate", "HF"], "CONFIG"),
    "simulate-profile": (["simulate", "GOOD", "--profile", "PROFILE"], "PROFILE"),
    "plan-model": (["plan", "--model", "BAD", "--cluster", "dgx-h100", "--gpus", "8"], "BAD"),
    "plan-cluster": (["plan", "--model", "gpt-1.7b", "--cluster", "BAD", "--gpus", "8"],
                     "BAD"),
    "sweep": (["sweep", "BAD", "--grid", "parallel.tp=1,2"], "BAD"),
    "sweep-profile": (["sweep", "GOOD", "--grid", "parallel.dp=8", "--profile", "PROFILE"],
                      "PROFILE"),
    "validate": (["validate", "BAD"], "BAD"),
    "collective-cluster": (["collective", "allreduce", "--cluster", "BAD", "--gpus", "16"],
                           "BAD"),
}


@pytest.mark.parametrize("case", sorted(NOT_UTF8))
def test_a_file_that_is_not_utf8_is_one_error_line_naming_it(capsys, files, case):
    argv, named = NOT_UTF8[case]
    line = one_error_line(*run(capsys, *(str(files.get(a, a)) for a in argv)))
    assert str(files[named]) in line and "not UTF-8" in line


def test_a_utf16_file_is_named_as_such(capsys, tmp_path):
    """What Windows PowerShell's ``>`` writes: UTF-16 with a byte-order mark."""
    path = tmp_path / "utf16.yaml"
    path.write_bytes(GOOD.encode("utf-16"))
    line = one_error_line(*run(capsys, "simulate", str(path)))
    assert str(path) in line and "UTF-16" in line


def test_a_byte_order_mark_is_read_past(capsys, tmp_path):
    """Notepad's UTF-8 starts with a byte-order mark; the profile reads as without it."""
    shipped = ROOT / "topologies" / "profiles" / "a100-80gb.json"
    profile = tmp_path / "bom.json"
    profile.write_bytes(b"\xef\xbb\xbf" + shipped.read_bytes())
    scenario = tmp_path / "good.yaml"
    scenario.write_text(GOOD)
    runs = [run(capsys, "simulate", str(scenario), "--json", "--profile", str(p))
            for p in (shipped, profile)]
    assert [code for code, _, _ in runs] == [0, 0], runs[1][2]
    assert strict_json(runs[0][1])["step_time_s"] == strict_json(runs[1][1])["step_time_s"]


SURROGATE = os.fsdecode(b"caf\xe9")  # how Python hands a shell's $'caf\xe9' to argv


@pytest.mark.parametrize("argv, flag", [
    (["simulate", "GOOD", "--set", f"name={SURROGATE}"], "--set"),
    (["sweep", "GOOD", "--grid", f"parallel.tp=1,{SURROGATE}"], "--grid"),
    (["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8", "--fix",
      f"parallel.tp={SURROGATE}"], "--fix"),
], ids=["set", "grid", "fix"])
def test_a_value_that_is_not_utf8_is_one_error_line_naming_its_flag(capsys, files, argv, flag):
    line = one_error_line(*run(capsys, *(str(files.get(a, a)) for a in argv)))
    assert line.startswith(f"error: {flag}: ") and "not UTF-8" in line


def _console() -> list[str]:
    exe = shutil.which("clustersim")
    return [exe] if exe else [sys.executable, "-m", "clustersim"]


@pytest.mark.parametrize("argv", [["presets", "--json"], ["presets"],
                                  ["simulate", "GOOD", "--json"]],
                         ids=["presets-json", "presets-table", "simulate-json"])
def test_a_reader_that_closes_the_pipe_gets_a_quiet_exit(files, argv):
    """``clustersim ... | head -1``, made certain: the pipe's reading end is closed before the
    command writes, so its first write fails (EPIPE), as when ``head`` has exited."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*_console(), *(str(files.get(a, a)) for a in argv)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" either
    assert proc.returncode == 1  # Python's SIGPIPE recipe; rich's tables exit the same way


JSON_COMMANDS = {
    "simulate": ["simulate", "GOOD", "--json"],
    "presets": ["presets", "--json"],
    "plan": ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
             "--tokens", "3e11", "--top", "1", "--fix", "parallel.tp=1", "--fix",
             "parallel.pp=1", "--fix", "training.micro_batch=1", "--fix", "parallel.zero=1",
             "--json"],
    "collective": ["collective", "allreduce", "--cluster", "dgx-h100", "--gpus", "16",
                   "--max-bytes", "4M", "--json"],
}  # validate --json: tests/validation/test_validate.py parses it strictly too


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_every_json_output_is_strict_json(capsys, files, command):
    code, out, err = run(capsys, *(str(files.get(a, a)) for a in JSON_COMMANDS[command]))
    assert code == 0, err
    assert strict_json(out) is not None


OUT_OF_REACH = {  # numbers JSON cannot hold or no job has; the field or flag each must name
    "tokens-1e400": (["simulate", "GOOD", "--json", "--set", "training.tokens=1e400"],
                     "training.tokens"),
    "tokens-nan": (["simulate", "GOOD", "--json", "--set", "training.tokens=.nan"],
                   "training.tokens"),
    "latency-1e300": (["simulate", "GOOD", "--json", "--set",
                       "cluster.inter_node.latency=1e300"], "cluster.inter_node.latency"),
    "batch-1e18": (["simulate", "GOOD", "--json", "--set", "training.global_batch=1e18"],
                   "training.global_batch"),
    "plan-tokens-inf": (["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                         "--gpus", "8", "--tokens", "inf", "--json"], "--tokens"),
    "plan-tokens-nan": (["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                         "--gpus", "8", "--tokens", "nan", "--json"], "--tokens"),
    "plan-mtbf-inf": (["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                       "--gpus", "8", "--mtbf-hours", "inf", "--json"], "--mtbf-hours"),
    "collective-size": (["collective", "allreduce", "--cluster", "dgx-h100", "--gpus", "16",
                         "--max-bytes", "9" * 40 + "G", "--json"], "--max-bytes"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_REACH))
def test_numbers_out_of_reach_are_one_error_line_naming_the_field(capsys, files, case):
    argv, field = OUT_OF_REACH[case]
    line = one_error_line(*run(capsys, *(str(files.get(a, a)) for a in argv)))
    assert line.startswith(f"error: {field}: "), line


def test_a_non_finite_result_is_refused_where_it_is(capsys):
    """The guard behind the input bounds: JSON has no NaN or Infinity (RFC 8259 sec. 6)."""
    with pytest.raises(ScenarioError) as info:
        print_json({"rows": [{"time_us": 1.0}, {"time_us": float("nan")}]})
    assert info.value.field == "result.rows.1.time_us"
    assert capsys.readouterr().out == ""


def test_a_sweep_with_no_point_simulated_lists_why(capsys, files):
    """tp 5 and 7 divide neither gpt-1.7b's 24 heads nor 8 GPUs: the table of fitting points
    is empty (it raised KeyError), and every point is listed with its reason."""
    code, out, err = run(capsys, "sweep", str(files["GOOD"]), "--grid", "parallel.tp=5,7")
    assert code == 0, err
    assert "Fastest of 0 fitting configurations" in out
    assert "parallel.tp=5: invalid" in out and "parallel.tp=7: invalid" in out
