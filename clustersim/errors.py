"""The one exception bad input raises, and its translation from pydantic's errors.

Every layer (YAML loading, presets, specs, cross-field rules) raises :class:`ScenarioError`
naming the dotted field at fault; the CLI prints it as one ``error:`` line and exits 2.
"""

from __future__ import annotations

from pydantic import ValidationError


class ScenarioError(ValueError):
    """Bad input: ``field`` is the dotted path into the scenario (``parallel.tp``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def join_path(*parts: object) -> str:
    """``join_path("parallel", "tp") == "parallel.tp"``, skipping empty parts."""
    return ".".join(str(p) for p in parts if p not in ("", None))


def from_validation_error(err: ValidationError, prefix: str = "", allowed: dict | None = None
                          ) -> ScenarioError:
    """The first of pydantic's errors as a ScenarioError under ``prefix``.

    ``allowed`` maps a section's dotted path to its model class, so that an unknown key can
    list the keys that are allowed there.
    """
    first = err.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    field = join_path(prefix, *loc)
    if first["type"] == "extra_forbidden":
        parent = join_path(prefix, *loc[:-1])
        keys = (allowed or {}).get(parent)
        hint = f" (allowed: {', '.join(keys)})" if keys else ""
        return ScenarioError(field, f"unknown key{hint}")
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
