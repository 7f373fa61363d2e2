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
    except UnicodeEncodeError as exc:  # a command-line value carrying non-UTF-8 bytes
        raise ScenarioError(source, f"{exc.object[exc.start:exc.end]!r} is not UTF-8 text; "
                                    "give UTF-8") from None


def read_text_file(path: str | Path, field: str | None = None, what: str = "file") -> str:
    """The text of an input file (scenario, profile, model config) as UTF-8, a byte-order
    mark dropped. A missing, unreadable or non-UTF-8 file raises ScenarioError under ``field``
    (default: the path itself), naming the file: every command reads its inputs here."""
    field = str(path) if field is None else field
    named = "" if field == str(path) else f"{str(path)!r}: "
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ScenarioError(field, f"{named}cannot read {what}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(field, f"{named}{_not_utf8(exc)}; save it as UTF-8") from None


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """Where decoding failed, and UTF-16 named when its byte-order mark starts the file
    (what Windows PowerShell's ``>`` writes)."""
    if exc.object[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "is UTF-16 text, not UTF-8"
    return f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def load_yaml_file(path: str | Path) -> Any:
    """Read and parse a YAML file; a missing, unreadable or non-UTF-8 file raises
    ScenarioError."""
    return load_yaml_text(read_text_file(path), source=str(path))


def parse_scalar(text: str, flag: str = "--set") -> Any:
    """A ``--set`` (or ``flag``) value as YAML reads it: ``4`` is an int, ``3e11`` a float,
    ``true`` a bool."""
    return load_yaml_text(text, source=flag) if text.strip() else text
