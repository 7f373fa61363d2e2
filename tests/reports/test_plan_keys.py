"""Every key the planner caches a shared value under holds each field the value reads: for
each field, two candidates that differ only there get different answers, and the cache keyed
without that field gives the second the first's (the test then fails, as it must). The oracle
is the value computed alone: ``build_scenario`` for the builder's framework defaults
(``ScenarioBuilder._resolve``), a fresh ``CostModel`` for one layer's costs shared by
``cost_model.layer_key``."""

from __future__ import annotations

import functools
import random

import pytest

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest
from clustersim.reports.plan_build import ScenarioBuilder, scenarios_of
from clustersim.reports.plan_search import candidates
from clustersim.reports.pool_plan import one_gpu_cluster
from clustersim.simulator.costs import compute, cost_model
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.inputs import frameworks
from clustersim.simulator.inputs.scenario import build_cluster, build_scenario

MODEL, CLUSTER = {"preset": "gpt-1.7b"}, {"preset": "dgx-h100", "gpus": 8}

# Pairs of (training, parallel) sections that differ in one field the other section's half of
# ``frameworks.resolve`` reads, so that its resolved section differs.
PAIRS = {
    # the parallel half reads the stack: FSDP shards all (ZeRO-3 without a pipeline)
    "framework": (({"framework": "megatron"}, {}), ({"framework": "fsdp"}, {})),
    # ... and the precision: DeepSpeed's BF16_Optimizer runs zero 0 as ZeRO-1 under bf16
    "precision": (({"framework": "deepspeed", "precision": "bf16"}, {}),
                  ({"framework": "deepspeed", "precision": "fp32"}, {})),
    # the training half reads the ZeRO stage: DeepSpeed keeps fp32 gradients at zero 0 only
    "zero": (({"framework": "deepspeed"}, {"zero": 0}), ({"framework": "deepspeed"}, {"zero": 1})),
}


def _raw(training: dict, parallel: dict) -> dict:
    return {"model": MODEL, "cluster": CLUSTER,
            "training": {"global_batch": 8, "micro_batch": 1, **training}, "parallel": parallel}


def _builder_agrees(pair) -> bool:
    """Whether one builder gives both of ``pair`` the scenario ``build_scenario`` gives."""
    builder = ScenarioBuilder()
    for n, (training, parallel) in enumerate(pair):
        got, want = builder.build(_raw(training, parallel), f"s{n}"), build_scenario(
            _raw(training, parallel), f"s{n}")
        assert not isinstance(got, ScenarioError)
        if got != want:
            return False
    return True


@pytest.mark.parametrize("field", PAIRS)
def test_the_resolved_sections_are_keyed_by_every_field_they_read(field, monkeypatch):
    first, second = PAIRS[field]
    want = [build_scenario(_raw(*pair), "s") for pair in PAIRS[field]]
    assert want[0].training != want[1].training or want[0].parallel != want[1].parallel
    assert _builder_agrees((first, second))
    # the same keys without the field: the second candidate gets the first's resolution
    reads = {"framework": ("parallel_reads", 0), "precision": ("parallel_reads", 1),
             "zero": ("training_reads", 1)}
    name, index = reads[field]
    whole = getattr(frameworks, name)
    monkeypatch.setattr(frameworks, name,
                        lambda section: tuple(v for i, v in enumerate(whole(section))
                                              if i != index))
    assert not _builder_agrees((first, second))


# One layer's costs the search shares by ``layer_key`` (``CostModel._shared_once``), each
# against its own computed alone, on the candidates of a MoE problem with tp, cp and ep.
SHARED = {
    "per_layer": cost_model.layer_times,
    "per_layer_comm_kinds": cost_model._comm_kinds,
    "weight_gradients": lambda cm: cm.weight_gradients,
    "split_cost": lambda cm: cm.split_cost,
    "head_times": lambda cm: cm.head_times,
}
MOE = PlanRequest(model={"preset": "mixtral-8x7b", "seq_len": 32768},
                  cluster={"preset": "dgx-h100", "gpus": 8}, global_batch=8,
                  fixed={"parallel.zero": 1, "parallel.schedule": "1f1b"})


# FSDP keeps fp32 weights and casts them per use but under ZeRO-3, and accumulates
# gradients unfused, into the shard where they are sharded: one layer's costs read the ZeRO
# stage (``compute.sharding_reads``).
FSDP = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                   cluster={"preset": "dgx-h100", "gpus": 8}, global_batch=32,
                   training={"framework": "fsdp"}, fixed={"parallel.schedule": "1f1b"})


@functools.cache
def _scenarios(problem: str = "moe", limit: int = 400) -> tuple:
    """``limit`` valid candidates of a problem, drawn over its whole search (a seeded draw,
    not every k-th, which could fall in step with the search's nested loops and keep, say,
    only the candidates with TP overlap of one context-parallel exchange)."""
    req = {"moe": MOE, "fsdp": FSDP}[problem]
    base = build_scenario({"model": req.model, "cluster": one_gpu_cluster(req.cluster),
                           "training": {"global_batch": 1, **req.training}}, "plan")
    cluster, builder, out = build_cluster(req.cluster), ScenarioBuilder(), []
    for split in candidates(req, base, cluster):
        out += [s for s in scenarios_of(req, split, cluster, builder)
                if not isinstance(s, ScenarioError)]
    kept = sorted(random.Random(0).sample(range(len(out)), min(limit, len(out))))
    return tuple(out[i] for i in kept)


def _wrong(name: str, problem: str = "moe") -> int:
    """How many candidates of a problem get a shared ``name`` other than their own."""
    layers, wrong = {}, 0
    for s in _scenarios(problem):
        alone = SHARED[name](CostModel(s))
        wrong += getattr(CostModel(s, shared=layers), name) != alone
    return wrong


# The fields whose change alone, among the candidates, changes each shared cost.
READS = {
    "per_layer": ("ep", "recompute", "tp_comm_overlap", "micro_batch", "sharding", "cp_comm"),
    "per_layer_comm_kinds": ("ep", "recompute", "tp_comm_overlap", "micro_batch", "cp_comm"),
    "weight_gradients": ("micro_batch",),
    "split_cost": ("recompute", "tp_comm_overlap"),
    "head_times": ("micro_batch", "sharding"),
}


def _leave_out(field: str, monkeypatch) -> None:
    """``layer_key`` without ``field``: a parallel field among those ignored, the
    training section's micro-batch, or what one layer reads of the ZeRO stage."""
    if field == "sharding":
        monkeypatch.setattr(compute, "sharding_reads", lambda parallel: ())
        return
    if field != "micro_batch":
        monkeypatch.setattr(cost_model, "_LAYER_IGNORES",
                            cost_model._LAYER_IGNORES | {field})
        return
    whole = cost_model.layer_key

    def without_micro_batch(cm):
        key = whole(cm)
        training = tuple((k, v) for k, v in cm.s.training if k != "micro_batch")
        return (*key[:3], training, *key[4:])

    monkeypatch.setattr(cost_model, "layer_key", without_micro_batch)


@pytest.mark.parametrize("name", SHARED)
def test_one_layers_costs_are_keyed_by_every_field_they_read(name, monkeypatch):
    assert _wrong(name) == 0 and _wrong(name, "fsdp") == 0
    for field in READS[name]:  # left out of the key, candidates that differ there share
        with monkeypatch.context() as patch:
            _leave_out(field, patch)
            assert _wrong(name, "fsdp" if field == "sharding" else "moe") > 0, field
