"""Full and representative fidelity agree on the shipped examples where nothing contends
(issue 13): within 3%, every collective, send and layer of the step run as flows on the
fabric against closed forms. ``benchmarks/fidelity_agreement.py`` runs every example, the
large ones too; these are the ones that take a few seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICK = ["gpt-18b-a100", "llama3-70b-h100", "llama3-70b-oom", "mixtral-8x7b-h100",
         "mixtral-8x7b-dropless-h100", "mixtral-8x22b-mi300x", "qwen2-7b-hf-h100",
         "validate-gpt-60m", "zero-bubble-h1", "zero2-vs-zero1-ethernet"]


@pytest.mark.parametrize("name", QUICK)
def test_full_agrees_with_representative_within_3_percent(name):
    s = load_scenario(EXAMPLES / f"{name}.yaml")
    full = simulate(s, "full").step_time_s
    representative = simulate(s, "representative").step_time_s
    assert full == pytest.approx(representative, rel=0.03)
