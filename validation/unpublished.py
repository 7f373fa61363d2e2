"""What a published run may have been where its source left a setting out.

A published run was tuned: its authors ran the fastest setting that fit. Where the source does not
say which (the interleave depth of a Megatron-LM pipeline, whether it recomputed activations), a
comparison that pins the setting to a default scores the model on a run nobody made, and a fit on
such a table hides the difference in its fitted constants: Narayanan et al. (2021) ran the
interleaved schedule, and a fit that charged them 1F1B's bubble made every GPU it was fitted for
faster than it is. So both the development set (``devset.py``) and the published tables
(``published.py``) follow one rule: each unpublished setting below is simulated over its
candidates, and the run is scored on the fastest candidate that fits in memory.

Settings with candidates (the names a table's ``unknown_settings`` uses):

- ``recompute``: none, selective, full (selective only after Korthikanti et al., 2022-05);
- ``vpp`` (or ``schedule``), with a pipeline: 1F1B, and the interleaved schedule at every depth
  that divides the layers per stage (Megatron-LM's requirement);
- ``micro_batch_size``: 1, 2, 4 and 8, those the batch splits into (a run with few sequences per
  replica hides its gradient reduction behind the last micro-batch's backward alone, so the
  size decides how much of it shows).

Any other unpublished setting (ZeRO stage) stays as the scenario writes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RECOMPUTE = ("none", "selective", "full")
MICRO_BATCHES = (1, 2, 4, 8)  # the sizes NVIDIA's Megatron-LM and NeMo recipes use
BEFORE_SELECTIVE = ("none", "full")  # runs published before selective recomputation existed


def with_parallel(scenario: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``scenario`` with some ``parallel`` fields replaced (a new mapping; the input is kept)."""
    return {**scenario, "parallel": {**scenario["parallel"], **fields}}


def micro_batch_candidates(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """One scenario per size of ``MICRO_BATCHES``; a size the global batch does not split into
    is no scenario, and ``published.load_table`` drops it."""
    return [{**scenario, "training": {**scenario.get("training", {}), "micro_batch": size}}
            for size in MICRO_BATCHES]


def recompute_candidates(scenario: dict[str, Any],
                         kinds: Iterable[str] = RECOMPUTE) -> list[dict[str, Any]]:
    """One scenario per recomputation kind."""
    return [with_parallel(scenario, recompute=kind) for kind in kinds]


def interleave_candidates(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """1F1B, then the interleaved schedule at each depth dividing the layers per stage."""
    parallel = scenario["parallel"]
    pp = parallel.get("pp", 1)
    if pp <= 1:
        return [scenario]
    per_stage = scenario["model"]["layers"] // pp
    depths = [v for v in range(2, per_stage + 1) if per_stage % v == 0]
    return [with_parallel(scenario, schedule="1f1b", virtual_stages=1)] + [
        with_parallel(scenario, schedule="interleaved", virtual_stages=v) for v in depths]


def candidates(scenario: dict[str, Any], unknown: Iterable[str],
               recompute_kinds: Iterable[str] = RECOMPUTE) -> list[dict[str, Any]]:
    """The scenarios a run may have been, given the settings its source did not publish: the
    scenario as written first, then every other combination of the candidates."""
    unknown = set(unknown)
    options = interleave_candidates(scenario) if unknown & {"vpp", "schedule"} else [scenario]
    if "recompute" in unknown:
        kinds = tuple(recompute_kinds)
        options = [c for option in options for c in recompute_candidates(option, kinds)]
    if "micro_batch_size" in unknown:
        options = [c for option in options for c in micro_batch_candidates(option)]
    return [scenario] + [option for option in options if option != scenario]
