"""``memory.stage_memory`` for the planner, which asks it of tens of thousands of splits that
are alike in part: what a stage's peak is made of, each part computed once per distinct value
of what it reads, in a cache the caller keeps (``reports/plan_search.SplitSearch``'s).

- the model states (``memory.stage_model_states``) never read the micro-batch, the
  recomputation or the tensor-parallel overlap switches: one per ZeRO stage of a layout;
- the activations (``memory.stage_activation_bytes``, with a split backward's deferred weight
  halves) never read how data parallelism shards and overlaps, nor the tensor-parallel
  overlap switches: one for the ZeRO stages and TP overlap of a split;
- the buffers are cheap and read nearly everything: computed for each;
- whether the split fits at all reads none of the tensor-parallel overlap switches: one
  verdict for the candidates that differ only there (``verdict_key``).

A key holds everything else of the scenario: its model and cluster by identity (the planner
builds every candidate on the same two, ``reports/plan_build.py``), its training section by
value, its parallel section but for the fields named here. ``tests/reports/test_plan_build.py``
checks that every stage of every candidate of two problems gets from a shared cache what
``memory.stage_memory`` computes alone, and that the test fails when a field the part reads is
named here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import memory as mem
from .last_scenario import Same, parallel_key, per_scenario

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario

# What the model states never read (stage_model_states and all it calls).
STATES_IGNORE = frozenset({"recompute", "recompute_modules", "tp_comm_overlap",
                           "tp_backward_overlap"})
# What the activations never read (stage_activation_bytes and all it calls: activations.py,
# split_backward.py, the schedules' in-flight counts): how data parallelism shards and
# overlaps, and whether tensor-parallel collectives overlap GEMMs.
ACTIVATIONS_IGNORE = frozenset({"zero", "overlap_grad_reduce", "overlap_param_gather",
                                "zero3_prefetch", "zero3_pipeline_reduce", "tp_comm_overlap",
                                "tp_backward_overlap"})


# What no part of a stage's memory reads (model states, activations, buffers, nor which stages
# decide: ``plan_memory.checked_stages``): whether tensor-parallel collectives overlap GEMMs.
# Candidates that differ only there (the planner tries both) fit or not alike.
MEMORY_IGNORE = STATES_IGNORE & ACTIVATIONS_IGNORE


def verdict_key(s: Scenario) -> tuple:
    """The key of whether ``s`` fits: everything of it but ``MEMORY_IGNORE``."""
    return ("fits", Same(s.model), Same(s.cluster), s.training,
            parallel_key(s, MEMORY_IGNORE))


def with_zero(key: tuple, zero: int) -> tuple:
    """``verdict_key(s)`` of the scenario ``s`` with ZeRO stage ``zero``, everything else
    the same."""
    *head, parallel = key
    return (*head, tuple((k, zero if k == "zero" else v) for k, v in parallel))


@per_scenario
def _prefixes(s: Scenario) -> tuple[tuple, tuple]:
    """The keys of the scenario's model states and activations, but for the stage: built once
    per scenario, as the planner asks for its stages in turn."""
    model, cluster = Same(s.model), Same(s.cluster)
    training = tuple((k, v) for k, v in s.training.__dict__.items() if k != "micro_batch")
    return (("states", model, cluster, training, parallel_key(s, STATES_IGNORE)),
            ("activations", model, cluster, s.training, parallel_key(s, ACTIVATIONS_IGNORE)))


def _prefix_ids(s: Scenario, cache: dict) -> tuple[int, int]:
    """The keys ``_prefixes`` builds, each as a small number given once per distinct key in
    ``cache``: a key of a few dozen fields is hashed once per scenario, not once per stage
    and lookup (a tuple does not keep its hash)."""
    last = cache.get("last prefixes")
    if last is not None and last[0] is s:
        return last[1]
    ids = cache.setdefault("prefix ids", {})
    states, activations = _prefixes(s)
    found = (ids.setdefault(states, len(ids)), ids.setdefault(activations, len(ids)))
    cache["last prefixes"] = (s, found)  # keeps ``s`` alive: its id is not reused meanwhile
    return found


def stage_memory(s: Scenario, stage: int, cache: dict) -> mem.StageMemory:
    """``memory.stage_memory(s, stage)``, its model states and activations taken from
    ``cache`` where a split alike in what they read put them."""
    states_id, activations_id = _prefix_ids(s, cache)
    states_key, activations_key = ("states", states_id, stage), ("activations", activations_id,
                                                                  stage)
    if states_key not in cache:
        cache[states_key] = mem.stage_model_states(s, stage)
    if activations_key not in cache:
        cache[activations_key] = mem.stage_activation_bytes(s, stage)
    params, grads, optimizer = cache[states_key]
    return mem.StageMemory(stage, params, grads, optimizer, cache[activations_key],
                           mem.stage_buffer_bytes(s, stage),
                           optimizer_step=mem.optimizer_step_bytes(s, stage))
