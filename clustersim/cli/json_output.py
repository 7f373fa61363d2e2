"""The one place a command's ``--json`` is written: strict JSON, one value on stdout.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which are not JSON
(RFC 8259 sec. 6: "Numeric values that cannot be represented ... (such as Infinity and NaN)
are not permitted"); ``jq`` and JavaScript's ``JSON.parse`` refuse them. Inputs are bounded so
that results stay finite (clustersim/fields.py); should one still not be, the command says
which value, as one ``error:`` line, instead of writing what no parser reads.
"""

from __future__ import annotations

import json
import math
from typing import Any

from clustersim.errors import ScenarioError


def print_json(data: Any) -> None:
    """Print ``data`` as indented, strict JSON; a non-finite number raises ScenarioError
    naming where in ``data`` it is."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        where = non_finite_path(data) or "?"
        raise ScenarioError(f"result.{where}", "is not a finite number, and JSON has none; "
                                               "check the scenario's numbers") from None
    print(text)


def non_finite_path(data: Any, path: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in nested dicts and lists, else None."""
    if isinstance(data, float):
        return None if math.isfinite(data) else path
    items = (data.items() if isinstance(data, dict)
             else enumerate(data) if isinstance(data, list | tuple) else ())
    for key, value in items:
        found = non_finite_path(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
