"""Every model preset's parameter count, computed from its shape, matches its published size."""

from __future__ import annotations

import re

import pytest

from clustersim.simulator.inputs.presets import PRESET_METADATA, model_presets
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model.param_counts import total_params

PRESETS = model_presets()


def published(text: str) -> tuple[float, float]:
    """``"1.7B"`` -> (1.7e9, 0.05e9): the figure and half a unit of its last printed digit."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?B", text)
    assert match, f"published_params {text!r} is not like '46.7B'"
    decimals = len(match.group(2) or "")
    return float(text[:-1]) * 1e9, 0.5 * 10.0 ** -decimals * 1e9


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_count_matches_the_published_size(name):
    """Within 1%, or within the rounding of the printed figure (Narayanan's "1.7B" is 1.65B)."""
    entry = PRESETS[name]
    spec = ModelSpec.model_validate({k: v for k, v in entry.items() if k not in PRESET_METADATA})
    count = total_params(spec)
    figure, rounding = published(entry["published_params"])
    assert abs(count - figure) <= max(0.01 * figure, rounding), (
        f"{name}: {count / 1e9:.3f}B from the shape, published {entry['published_params']}")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_cites_its_source(name):
    assert PRESETS[name].get("source")


def test_narayanan_closed_form_for_the_gpt_family():
    """Narayanan et al. 2021 eq. (P): 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).

    Their count omits only the final LayerNorm (2h), which ours includes.
    """
    for name in [n for n in PRESETS if n.startswith("gpt-")]:
        m = ModelSpec.model_validate({k: v for k, v in PRESETS[name].items()
                                      if k not in PRESET_METADATA})
        l, h, v, s = m.layers, m.hidden, m.vocab, m.seq_len
        closed = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        assert total_params(m) == pytest.approx(closed + 2 * h, rel=1e-12)


def test_required_presets_exist():
    required = {"gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                "llama3-405b", "mixtral-8x7b", "gpt-1.7b", "gpt-1t"}
    assert required <= set(PRESETS)
