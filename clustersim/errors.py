"""The one exception bad input raises, and its translation from pydantic's errors.

Every layer (YAML loading, presets, specs, cross-field rules) raises :class:`ScenarioError`
naming the dotted field at fault; the CLI prints it as one ``error:`` line and exits 2.
"""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ValidationError


class ScenarioError(ValueError):
    """Bad input: ``field`` is the dotted path into the scenario (``parallel.tp``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple:
        """Pickled as its two fields: a worker process of ``plan --jobs`` or a sweep can send
        one back (the default rebuilds it from the joined text alone, and fails)."""
        return type(self), (self.field, self.message)


def join_path(*parts: object) -> str:
    """``join_path("parallel", "tp") == "parallel.tp"``, skipping empty parts."""
    return ".".join(str(p) for p in parts if p not in ("", None))


def unknown_key(key: str, allowed: list[str] | tuple[str, ...] | None) -> str:
    """The message for an unknown ``key``: the closest allowed key, if one is close (a typo:
    ``global_bacth``), then every allowed key."""
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(key, allowed, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{guess} (allowed: {', '.join(allowed)})"


def model_keys(model: type[BaseModel] | None, path: list[str]) -> list[str] | None:
    """The keys of the pydantic model found at ``path`` (field names; list indices skipped)
    below ``model``, or None where the path leaves the models."""
    for part in path:
        if model is None or part.isdigit():
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return None
    return list(model.model_fields) if model is not None else None


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model class in an annotation (``LinkTier``, ``LinkTier | None``, ``list[...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, typing.get_args(annotation))), None)


def from_validation_error(err: ValidationError, prefix: str = "", allowed: dict | None = None,
                          model: type[BaseModel] | None = None) -> ScenarioError:
    """The first of pydantic's errors as a ScenarioError under ``prefix``.

    An unknown key is reported before any other error: a misspelled required key
    (``global_bacth``) is also a missing one, and the typo is what the user must fix.
    ``allowed`` maps a section's dotted path to the keys allowed there, so that an unknown key
    can list them; sections it does not name take the fields of ``model`` (the validated
    class) at that path.
    """
    errors = err.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    field = join_path(prefix, *loc)
    if first["type"] == "extra_forbidden":
        parent = join_path(prefix, *loc[:-1])
        keys = (allowed or {}).get(parent) or model_keys(model, loc[:-1])
        return ScenarioError(field, unknown_key(loc[-1], keys))
    message = _limit_message(first) or first["msg"]
    if first["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    # A whole section's input (a model-level rule) would dump the mapping: the message names it.
    if ("input" in first and first["type"] not in ("missing",)
            and not isinstance(first["input"], dict | list)):
        message = f"{message} (got {first['input']!r})"
    return ScenarioError(field, message)


def _limit_message(error: dict) -> str | None:
    """A ceiling of ``clustersim.fields`` broken, said with its reason and written readably
    (pydantic writes 1e18 as 1000000000000000000)."""
    from .fields import LIMIT_REASONS

    limit = (error.get("ctx") or {}).get("le")
    if error["type"] != "less_than_equal" or limit not in LIMIT_REASONS:
        return None
    shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
    return f"must be at most {shown}, {LIMIT_REASONS[limit]}"
