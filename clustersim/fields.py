"""Numeric field types shared by the specs: positive counts and sizes, never booleans.

pydantic's lax mode reads ``True`` as 1; a scenario saying ``tp: yes`` is a mistake, so these
types refuse booleans before the number check.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


PositiveInt = Annotated[int, BeforeValidator(no_bool), Field(gt=0)]
NonNegativeInt = Annotated[int, BeforeValidator(no_bool), Field(ge=0)]
PositiveFloat = Annotated[float, BeforeValidator(no_bool), Field(gt=0)]
NonNegativeFloat = Annotated[float, BeforeValidator(no_bool), Field(ge=0)]
Fraction = Annotated[float, BeforeValidator(no_bool), Field(gt=0, le=1)]
