"""The strict YAML loader reads numbers and booleans as YAML 1.2 does and refuses duplicates."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.yamlio import load_yaml_text, parse_scalar


@pytest.mark.parametrize("text, value", [
    ("3e11", 3e11), ("3.0e11", 3e11), ("3.0e+11", 3e11), ("1.5E-6", 1.5e-6), (".5", 0.5),
    ("8", 8), ("-3", -3), ("0x10", 16),
])
def test_numbers_without_a_signed_exponent_are_numbers(text, value):
    """PyYAML's YAML 1.1 resolver would return the string '3.0e11' (NOTES.md B1)."""
    assert load_yaml_text(f"x: {text}")["x"] == value


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "y", "n"])
def test_yaml11_boolean_words_stay_strings(word):
    assert load_yaml_text(f"x: {word}")["x"] == word


def test_true_and_false_are_booleans():
    assert load_yaml_text("a: true\nb: False") == {"a": True, "b": False}


def test_duplicate_keys_are_refused_with_the_line():
    with pytest.raises(ScenarioError, match=r"line 3.*duplicate key 'tp'"):
        load_yaml_text("parallel:\n  tp: 2\n  tp: 4\n", source="s.yaml")


def test_malformed_yaml_names_the_source():
    with pytest.raises(ScenarioError) as info:
        load_yaml_text("model: [1, 2\n", source="bad.yaml")
    assert info.value.field == "bad.yaml"
    assert "malformed YAML" in info.value.message


def test_set_values_parse_as_yaml_scalars():
    assert parse_scalar("4") == 4
    assert parse_scalar("3e11") == 3e11
    assert parse_scalar("interleaved") == "interleaved"
    assert parse_scalar("false") is False
