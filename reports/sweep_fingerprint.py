"""What a saved sweep was computed from, so that a rerun resumes only the very same sweep.

A table saved with ``--out FILE`` gets a sidecar ``FILE.fingerprint.json`` (beside it, so the
table itself stays a plain CSV or Parquet file for pandas, spreadsheets and ``csv``). It holds
every input a row depends on: the base scenario after the ``--set`` overrides (as written and
as resolved from presets and model files), the grid, the overrides, the profile's contents,
the estimator options, and clustersim's version and a digest of its code and data files (a
development checkout changes without a version bump; the shipped GPU profiles are data files).

A rerun resumes only when every part matches. Otherwise it refuses before writing anything,
naming what changed and ``--fresh``, the flag that replaces the old table (issue 24: a resumed
table of another sweep is a wrong answer given without a word).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from clustersim import version
from clustersim.errors import ScenarioError

FORMAT = "clustersim sweep fingerprint 1"
# Files of the installed packages whose change can change a row: code, presets, profiles.
CODE_SUFFIXES = (".py", ".yaml", ".json", ".csv")
SHOWN_DIFFERENCES = 3  # scenario fields named in the message; the rest are counted


def sidecar(out: Path) -> Path:
    """Where the fingerprint of the table ``out`` lives."""
    return out.with_name(f"{out.name}.fingerprint.json")


def make_fingerprint(raw: dict, resolved: dict | None, grid: list[str], overrides: list[str],
                     profile: str | None, estimator: dict) -> dict[str, Any]:
    """The inputs of a sweep as plain JSON data (``resolved``: the built base scenario's
    ``as_dict()``, or None where the base alone does not build)."""
    return _plain({
        "format": FORMAT,
        "scenario": {"as_written": raw, "resolved": resolved},
        "overrides": list(overrides),
        "grid": list(grid),
        "profile": _profile_part(profile),
        "estimator": estimator,
        "clustersim": {"version": version.__version__, "code": code_digest()},
    })


def _profile_part(profile: str | None) -> dict | None:
    """The profile file as given and a digest of what it says (None: the shipped profile of
    each GPU, covered by the code digest). A profile that cannot be read fails here, once."""
    if not profile:
        return None
    from clustersim.topologies.profile import load_profile

    contents = load_profile(profile).model_dump_json()
    return {"file": str(profile), "sha256": hashlib.sha256(contents.encode()).hexdigest()}


@cache
def code_digest() -> str:
    """SHA-256 over the path and bytes of every code and data file of the installed
    clustersim packages, in path order."""
    digest = hashlib.sha256()
    for root in _package_folders():
        for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES
                           and "__pycache__" not in p.parts):
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _package_folders() -> list[Path]:
    """The folders of clustersim's packages, found without importing them (validation's
    imports torch)."""
    names = ("clustersim", *(f"clustersim.{n}" for n in
                             ("simulator", "topologies", "validation", "reports")))
    return [Path(next(iter(find_spec(name).submodule_search_locations))) for name in names]


def _plain(data: Any) -> Any:
    """As JSON would read it back (tuples as lists, dates as text), so that a fingerprint
    compares equal to the one loaded from its sidecar."""
    return json.loads(json.dumps(data, sort_keys=True, default=str))


# --- on disk ------------------------------------------------------------------------------------

def write_fingerprint(out: Path, fingerprint: dict) -> None:
    """Write the sidecar atomically (a temporary file renamed over it)."""
    path = sidecar(out)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(fingerprint, indent=1, sort_keys=True) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_resumable(out: Path, fingerprint: dict) -> None:
    """Refuse to resume ``out`` unless its sidecar records the same inputs."""
    path = sidecar(out)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        _refuse(out, f"has no {path.name} recording what it was computed from (written by an "
                     "older clustersim, or copied without it)")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _refuse(out, f"has an unreadable {path.name} ({exc})")
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        _refuse(out, f"has a {path.name} that is not a clustersim sweep fingerprint")
    changed = differences(saved, fingerprint)
    if changed:
        _refuse(out, "was computed from other inputs: " + "; ".join(changed))


def _refuse(out: Path, why: str) -> None:
    raise ScenarioError("--out", f"{str(out)!r} {why}; pass --fresh to replace it, or pick "
                                 "another --out")


# --- what changed -------------------------------------------------------------------------------

def differences(old: dict, new: dict) -> list[str]:
    """Each changed part of a fingerprint, in words, scenario first."""
    out = []
    scenario = _scenario_changes(old.get("scenario") or {}, new["scenario"])
    if scenario:
        out.append(f"scenario changed ({scenario})")
    for key, flag in (("overrides", "--set"), ("grid", "--grid")):
        if old.get(key) != new[key]:
            out.append(f"{flag} changed ({_listed(old.get(key))} -> {_listed(new[key])})")
    if old.get("profile") != new["profile"]:
        out.append(f"--profile changed ({_profile_text(old.get('profile'))} -> "
                   f"{_profile_text(new['profile'])})")
    estimator_old = old.get("estimator") or {}
    for key, value in new["estimator"].items():
        if estimator_old.get(key) != value:
            out.append(f"--{key} changed ({estimator_old.get(key)} -> {value})")
    out += _clustersim_changes(old.get("clustersim") or {}, new["clustersim"])
    return out


def _scenario_changes(old: dict, new: dict) -> str:
    """The first few fields that differ, resolved values first (what the model saw), else as
    written; empty when the scenario is the same."""
    for part in ("resolved", "as_written"):
        fields = _field_changes(old.get(part), new[part])
        if fields:
            shown = fields[:SHOWN_DIFFERENCES]
            more = len(fields) - len(shown)
            return ", ".join(shown) + (f" and {more} more" if more else "")
    return ""


def _field_changes(old: Any, new: Any) -> list[str]:
    a, b = _flat(old), _flat(new)
    return [f"{key}: {_value(a.get(key))} -> {_value(b.get(key))}"
            for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``dotted.path: value``."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix or data is not None else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _value(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value)


def _listed(items: list | None) -> str:
    return " ".join(items) if items else "none"


def _profile_text(part: dict | None) -> str:
    if part is None:
        return "the shipped profile"
    return f"{part['file']} (sha256 {part['sha256'][:12]})"


def _clustersim_changes(old: dict, new: dict) -> list[str]:
    if old.get("version") != new["version"]:
        return [f"clustersim version changed ({old.get('version')} -> {new['version']})"]
    if old.get("code") != new["code"]:
        return [f"clustersim's code or data changed (same version {new['version']}; digest "
                f"{str(old.get('code'))[:12]} -> {new['code'][:12]})"]
    return []
