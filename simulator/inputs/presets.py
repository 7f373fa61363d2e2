"""Model presets (``presets/models.yaml``) and the preset-plus-overrides merge of every section."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

from clustersim.errors import ScenarioError
from clustersim.yamlio import load_yaml_text

# Keys of a preset entry that describe it rather than the model.
PRESET_METADATA = ("published_params", "source")


@cache
def model_presets() -> dict[str, dict]:
    """Model presets by name, metadata included (see ``PRESET_METADATA``)."""
    text = files("clustersim.simulator").joinpath("presets/models.yaml").read_text("utf-8")
    return load_yaml_text(text, source="models.yaml")


def resolve_preset(section: Any, presets: dict[str, dict], field: str,
                   drop: tuple[str, ...] = ()) -> dict:
    """``section``'s ``preset`` entry with the section's own keys laid over it.

    Raises ScenarioError naming ``field.preset`` with the valid names when the preset is
    unknown, and ``field`` when the section is not a mapping.
    """
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ScenarioError(field, f"expected a mapping, got {type(section).__name__}")
    overrides = dict(section)
    name = overrides.pop("preset", None)
    if name is None:
        return overrides
    if not isinstance(name, str) or name not in presets:
        valid = ", ".join(sorted(presets))
        raise ScenarioError(f"{field}.preset", f"unknown preset {name!r} (valid: {valid})")
    base = {k: v for k, v in presets[name].items() if k not in drop}
    return deep_merge(base, overrides)


def deep_merge(base: dict, overrides: dict) -> dict:
    """A copy of ``base`` with ``overrides`` laid over it, merging nested mappings."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
