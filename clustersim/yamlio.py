"""A strict YAML loader for scenario and catalogue files.

PyYAML implements YAML 1.1, whose resolvers surprise people (NOTES.md B1): ``3.0e11`` loads as
a string (the float pattern wants a signed exponent), ``on``/``no``/``off``/``yes`` load as
booleans, and a duplicate key silently wins. This loader reads numbers and booleans as
YAML 1.2's core schema does and rejects duplicate keys.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ScenarioError

# YAML 1.2 core schema: exponent sign optional, so 3e11 and 3.0e11 are floats.
_FLOAT_12 = re.compile(
    r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"
    r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"
)
_INT_12 = re.compile(r"^[-+]?[0-9]+$|^0x[0-9a-fA-F]+$|^0o[0-7]+$")
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


# libyaml's parser when PyYAML was built with it: the catalogues load about 5x faster, which is
# most of `clustersim simulate`'s non-import start-up (issue 12). Resolvers and constructors
# stay PyYAML's Python ones, so the rules below apply to both.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """SafeLoader with YAML 1.2 scalars and no duplicate keys."""


# Drop YAML 1.1's implicit resolvers for bool/int/float, then add the 1.2 ones.
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                           "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_12, list("tTfF"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    return int(loader.construct_scalar(node), 0)


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, source: str = "<string>") -> Any:
    """Parse YAML text strictly; malformed input raises ScenarioError naming ``source``."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(source, f"malformed YAML{where}: {problem}") from None


def load_yaml_file(path: str | Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file raises ScenarioError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(path), f"cannot read file: {exc.strerror}") from None
    return load_yaml_text(text, source=str(path))


def parse_scalar(text: str) -> Any:
    """A ``--set`` value as YAML reads it: ``4`` is an int, ``3e11`` a float, ``true`` a bool."""
    return load_yaml_text(text, source="--set") if text.strip() else text
