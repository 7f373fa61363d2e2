"""Fit hints: a scenario that runs out of memory is told which changes make it fit, and each
hint, applied with ``--set``, does fit with the step time and memory the hint reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clustersim.cli import main

# Llama 3 70B on 64 H100s with tp 8 and no sharding: 16 bytes per parameter over tp 8 alone
# (~141 GB of model states per GPU) cannot fit in 80 GB, whatever the activations.
ONE_CHANGE = {"name": "oom-one", "model": {"preset": "llama3-70b"},
              "cluster": {"preset": "dgx-h100", "nodes": 8},
              "training": {"global_batch": 64, "micro_batch": 2},
              "parallel": {"tp": 8, "pp": 1, "zero": 0, "sequence_parallel": True}}
# With tp 4 and micro-batch 4 (445 GiB) no single change is enough: ZeRO-3 alone leaves the
# activations of 4 x 8192 tokens, a smaller micro-batch alone leaves unsharded Adam state.
TWO_CHANGES = {**ONE_CHANGE, "name": "oom-two",
               "training": {"global_batch": 64, "micro_batch": 4},
               "parallel": {"tp": 4, "pp": 1, "zero": 0, "sequence_parallel": True}}

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _write(tmp_path, scenario: dict, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(scenario))
    return path


def _simulate_json(capsys, *argv: str) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _flags(hint: dict) -> list[str]:
    out = []
    for path, value in hint["set"].items():
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) \
            else str(value)
        out += ["--set", f"{path}={text}"]
    return out


def _check_every_hint_fits(capsys, path, hints: list[dict]) -> None:
    for hint in hints:
        again = _simulate_json(capsys, str(path), *_flags(hint))
        assert again["memory"]["fits"], hint
        assert again["step_time_s"] == pytest.approx(hint["step_time_s"], rel=1e-12)
        assert again["memory"]["peak_bytes"] == hint["peak_bytes"]
        assert again["memory"]["peak_bytes"] <= again["memory"]["capacity_bytes"]


@pytest.mark.parametrize("scenario, size", [(ONE_CHANGE, 1), (TWO_CHANGES, 2)])
def test_every_hint_applied_with_set_fits_as_reported(capsys, tmp_path, scenario, size):
    path = _write(tmp_path, scenario)
    out = _simulate_json(capsys, str(path))
    assert out["memory"]["fits"] is False
    hints = out["memory"]["fit_hints"]
    assert 1 <= len(hints) <= 5
    assert all(len(h["set"]) == size for h in hints)  # pairs only when no single change fits
    steps = [h["step_time_s"] for h in hints]
    assert steps == sorted(steps)
    _check_every_hint_fits(capsys, path, hints)


def test_one_change_hints_are_the_memory_savers_that_fit(capsys, tmp_path):
    hints = _simulate_json(capsys, str(_write(tmp_path, ONE_CHANGE)))["memory"]["fit_hints"]
    changed = {path for h in hints for path in h["set"]}
    # ZeRO-2 shards gradients and optimizer over dp 8: 2 + (2 + 12) / 8 bytes per parameter.
    assert "parallel.zero" in changed
    zero = {h["set"]["parallel.zero"] for h in hints if "parallel.zero" in h["set"]}
    # ZeRO-1 still holds whole gradients beside the activations: about 91 GiB, too much.
    assert zero <= {2, 3} and 2 in zero


def test_a_pinned_dp_is_rederived_in_the_hint(capsys, tmp_path):
    pinned = {**ONE_CHANGE, "parallel": {**ONE_CHANGE["parallel"], "dp": 8}}
    path = _write(tmp_path, pinned)
    hints = _simulate_json(capsys, str(path))["memory"]["fit_hints"]
    deeper = [h for h in hints if "parallel.pp" in h["set"]]
    assert deeper, hints
    for h in deeper:
        assert h["set"]["parallel.dp"] == 64 // (8 * h["set"]["parallel.pp"])
    _check_every_hint_fits(capsys, path, hints)


def test_a_scenario_that_fits_has_no_hints(capsys):
    out = _simulate_json(capsys, str(EXAMPLES / "llama3-70b-h100.yaml"))
    assert out["memory"]["fits"] and out["memory"]["fit_hints"] == []


def test_hints_follow_the_fidelity_of_the_run(capsys, tmp_path):
    path = _write(tmp_path, ONE_CHANGE)
    hints = _simulate_json(capsys, str(path), "--fidelity", "analytic")["memory"]["fit_hints"]
    assert hints and {h["fidelity"] for h in hints} == {"analytic"}
    for hint in hints:
        again = _simulate_json(capsys, str(path), "--fidelity", "analytic", *_flags(hint))
        assert again["memory"]["fits"]
        assert again["step_time_s"] == pytest.approx(hint["step_time_s"], rel=1e-12)


def test_text_output_lists_the_hints_as_set_flags(capsys, tmp_path):
    assert main(["simulate", str(_write(tmp_path, ONE_CHANGE))]) == 0
    out = capsys.readouterr().out
    assert "OUT OF MEMORY" in out and "Would fit with" in out
    assert "--set parallel.zero=2" in out


def test_when_nothing_near_fits_the_text_says_so(capsys, tmp_path):
    # 405B on 8 GPUs: ~6.5 TB of model states against 640 GB, whatever one or two fields say.
    hopeless = {**ONE_CHANGE, "model": {"preset": "llama3-405b"},
                "cluster": {"preset": "dgx-h100", "nodes": 1},
                "training": {"global_batch": 8, "micro_batch": 1}}
    path = _write(tmp_path, hopeless)
    assert _simulate_json(capsys, str(path))["memory"]["fit_hints"] == []
    assert main(["simulate", str(path)]) == 0
    assert "try more GPUs" in capsys.readouterr().out


def test_a_recompute_hint_clears_the_selective_modules():
    """recompute_modules choose what selective recomputation re-runs: a hint that moves to full
    recomputation drops them, or its scenario would be refused and the hint lost."""
    from clustersim.reports import hints
    from clustersim.simulator.inputs.scenario import build_scenario

    raw = {**ONE_CHANGE, "parallel": {**ONE_CHANGE["parallel"], "recompute": "selective",
                                      "recompute_modules": ["core_attn"]}}
    built = hints._build(raw, build_scenario(raw), {"parallel.recompute": "full"})
    assert built is not None
    change, s = built
    assert change["parallel.recompute_modules"] is None and s.parallel.recompute == "full"


def test_a_foreach_optimizer_that_overflows_in_its_step_is_told_to_fuse(capsys, tmp_path):
    """A 4.1B GPT on one 80 GB H100 with full recomputation: 18 bytes of states per parameter
    and little else fit; torch's foreach Adam adds 4 more in its step (sqrt(v)), which does
    not. The fused step, the one change that costs no speed, is the first hint."""
    step = {"name": "oom-step", "model": {"preset": "gpt-3.6b", "layers": 36},
            "cluster": {"preset": "dgx-h100", "gpus": 1},
            "training": {"global_batch": 8, "micro_batch": 1, "optimizer_impl": "foreach"},
            "parallel": {"recompute": "full"}}
    path = _write(tmp_path, step)
    out = _simulate_json(capsys, str(path))
    assert not out["memory"]["fits"]
    assert out["memory"]["per_stage"][0]["optimizer_step"] > 0
    hints = out["memory"]["fit_hints"]
    assert hints[0]["set"] == {"training.optimizer_impl": "fused"}
    _check_every_hint_fits(capsys, path, hints)
    assert main(["simulate", str(path)]) == 0  # the text report shows the step's column
    text = capsys.readouterr().out
    assert "what a foreach optimizer step holds" in text
    assert "--set training.optimizer_impl=fused" in text
