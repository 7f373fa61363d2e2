"""The planner builds each candidate's scenario from sections it validated once
(``reports/plan_build.py``); the oracle is ``build_scenario`` of the same raw mapping, which
validates every section again, as a scenario file is checked. Every candidate of a problem
must give the same scenario, or the same error (field and message). And the costs the search
shares between candidates (one layer's, a stage's activations) are each one's own."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest
from clustersim.reports.plan_build import ScenarioBuilder, _name, _raw, scenarios_of
from clustersim.reports.plan_search import (
    candidates,
    checked_stages,
    fits_in_memory,
    stages_to_check,
)
from clustersim.reports.pool_plan import balanced, one_gpu_cluster, pool_variants
from clustersim.simulator.closed_form.analytic import stage_times
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import shared_memory
from clustersim.simulator.costs.compute import logits_times, weight_gradient_times
from clustersim.simulator.costs.cost_model import CostModel, layer_times
from clustersim.simulator.costs.split_backward import lost_cover
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.inputs.scenario import build_cluster, build_scenario
from clustersim.topologies.pools import PooledCluster

PROBLEMS = {
    # MoE at 32K tokens: cp and ep searched, many splits ruled out by the rules (ep over dp*cp)
    "mixtral": PlanRequest(model={"preset": "mixtral-8x7b"},
                           cluster={"preset": "dgx-h100", "gpus": 8}, global_batch=8),
    # pinned fields laid over every candidate; kv heads and a too-short pipeline rule some out
    "llama-pinned": PlanRequest(model={"preset": "llama2-13b", "seq_len": 4096},
                                cluster={"preset": "dgx-a100-40gb", "gpus": 16},
                                global_batch=64,
                                fixed={"parallel.overlap_grad_reduce": False,
                                       "parallel.zero": 1}),
    # a cluster of pools: one scenario per placement, and the balanced layers
    "pools": PlanRequest(model={"preset": "llama2-7b"},
                         cluster={"pools": [{"preset": "dgx-h100", "gpus": 8},
                                            {"preset": "dgx-a100-80gb", "gpus": 8}],
                                  "gpus": 16},
                         global_batch=8),
}
RESERVE = 0.05  # the planner's default memory reserve


def _built(raw: dict, name: str):
    try:
        return build_scenario(raw, name)
    except ScenarioError as exc:
        return exc


def _oracle(req: PlanRequest, split: dict, cluster) -> list:
    """What the search built before the builder: ``build_scenario`` of each raw mapping, one
    per placement on a cluster of pools, and its balanced layers."""
    raw = _raw(req, split)
    if not isinstance(cluster, PooledCluster):
        return [_built(raw, _name(split))]
    out = []
    for placed in pool_variants(raw, split, cluster, req.fixed):
        s = _built(placed, _name(split, placed["parallel"].get("stage_pools")))
        out.append(s)
        evened = None if isinstance(s, ScenarioError) else balanced(placed, s, req.fixed)
        if evened is not None:
            out.append(_built(evened, f"{s.name}-balanced"))
    return out


def _same(a, b) -> bool:
    if isinstance(a, ScenarioError) or isinstance(b, ScenarioError):
        return (type(a) is type(b) and a.field == b.field and a.message == b.message)
    return a == b


def _base(req: PlanRequest):
    """The request's model and cluster shapes, as ``plan_parallel.search_splits`` builds
    them, and its cluster."""
    base = build_scenario({"model": req.model, "cluster": one_gpu_cluster(req.cluster),
                           "training": {"global_batch": 1}}, "plan")
    return base, build_cluster(req.cluster)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_every_candidate_is_the_scenario_build_scenario_gives(name):
    req = PROBLEMS[name]
    base, cluster = _base(req)
    builder = ScenarioBuilder()
    errors = built = 0
    for split in candidates(req, base, cluster):
        got = list(scenarios_of(req, split, cluster, builder))
        want = _oracle(req, split, cluster)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert _same(a, b), (split, a, b)
            errors += isinstance(a, ScenarioError)
            built += not isinstance(a, ScenarioError)
    assert errors > 0 and built > 50  # both kinds were compared


@pytest.mark.parametrize("name", ["mixtral", "llama-pinned"])
def test_costs_shared_between_candidates_are_each_candidates_own(name):
    """The search shares one layer's costs between splits alike but for their schedule
    (``cost_model.layer_key``), the parallel groups' links between splits of one shape, and
    a stage's activations and model states between splits alike but for their ZeRO stage or
    micro-batch (``shared_memory.py``) and the stages whose memory is
    checked (``plan_memory.fits_in_memory``); the oracle: each candidate's computed alone."""
    req = PROBLEMS[name]
    base, cluster = _base(req)
    builder, layers, activations = ScenarioBuilder(), {}, {}
    compared = stages = 0
    for split in candidates(req, base, cluster):
        for s in scenarios_of(req, split, cluster, builder):
            if isinstance(s, ScenarioError):
                continue
            alone = layer_times(CostModel(s))
            assert CostModel(s, shared=layers).per_layer == alone, s.name
            # the output layer's, shared by the same key (the end-stage bound reads it)
            assert CostModel(s, shared=layers).head_times == logits_times(CostModel(s)), s.name
            # one layer's comm by group, weight gradients and split cost: the same key
            shared = CostModel(s, shared=layers)
            assert shared.per_layer_comm_kinds == CostModel(s).per_layer_comm_kinds, s.name
            assert shared.weight_gradients == weight_gradient_times(CostModel(s)), s.name
            assert shared.split_cost == lost_cover(CostModel(s)), s.name
            # the links shared by the splits of one shape: the whole closed form of a stage
            last = s.parallel.pp - 1
            assert (stage_times(StageCosts(s, shared=layers).stage(last), last)
                    == stage_times(StageCosts(s).stage(last), last)), s.name
            for i in range(s.parallel.pp):
                assert (shared_memory.stage_memory(s, i, activations)
                        == mem.stage_memory(s, i)), s.name
                stages += 1
            assert checked_stages(s, activations) == stages_to_check(s), s.name
            # the verdict, shared by candidates that differ only in their TP overlap switches
            assert (fits_in_memory(s, RESERVE, activations)
                    == fits_in_memory(s, RESERVE)), s.name
            compared += 1
    layer_keys = [key for key in layers if not isinstance(key[0], str)]
    assert len(layer_keys) < compared / 2  # they did share (activations but with ZeRO pinned)
    verdicts = [key for key in activations if key[0][0] == "fits"]
    assert len(verdicts) < compared  # the overlap switches' twins shared theirs
    states = [key for key in activations if key[0] == "states"]
    acts = [key for key in activations if key[0] == "activations"]
    assert len(states) < stages / 2
    assert len(acts) < stages / 2 or "parallel.zero" in req.fixed


def test_a_cached_section_never_stands_in_for_one_equal_but_of_another_type():
    """``1 == True`` in Python, but a scenario refuses a boolean count: after building a
    scenario with ``micro_batch: 1`` (and ``tp: 1``), the builder still refuses ``True`` in
    either section, as ``build_scenario`` does."""
    builder = ScenarioBuilder()
    raw = {"model": {"preset": "gpt-1.7b"}, "cluster": {"preset": "dgx-h100", "gpus": 8},
           "training": {"global_batch": 8, "micro_batch": 1}, "parallel": {"tp": 1}}
    assert not isinstance(builder.build(raw, "ok"), ScenarioError)
    for section, field in (("training", "micro_batch"), ("parallel", "tp")):
        bad = {**raw, section: {**raw[section], field: True}}
        got = builder.build(bad, "bad")
        assert isinstance(got, ScenarioError) and got.field == f"{section}.{field}", got
        with pytest.raises(ScenarioError):
            build_scenario(bad, "bad")


def test_a_zero1_split_fits_where_its_zero0_twin_does():
    """The verdict a ZeRO-1 candidate takes from its ZeRO-0 twin (``plan_memory``'s
    ``_unsharded_twin_fits``) rests on every stage's peak being no larger under ZeRO-1; the
    oracle: ``memory.stage_memory`` of both, stage by stage, on every such pair of the MoE
    problem (and the search's verdicts equal each candidate's own, above)."""
    req = PROBLEMS["mixtral"]
    base, cluster = _base(req)
    builder, by_key, pairs = ScenarioBuilder(), {}, 0
    for split in candidates(req, base, cluster):
        for s in scenarios_of(req, split, cluster, builder):
            if not isinstance(s, ScenarioError):
                by_key[shared_memory.verdict_key(s)] = s
    for key, s in by_key.items():
        twin = by_key.get(shared_memory.with_zero(key, 0))
        if s.parallel.zero != 1 or twin is None:
            continue
        for i in range(s.parallel.pp):
            assert mem.stage_memory(s, i).peak_bytes <= mem.stage_memory(twin, i).peak_bytes
        pairs += 1
    assert pairs > 100


def test_deepspeeds_zero1_takes_no_verdict_from_its_zero0_twin():
    """DeepSpeed's ZeRO-1 optimizer holds a 1 GB gradient bucket the stage-0 FP16 optimizer
    does not, more than sharding a small model's optimizer state saves: its ZeRO-0 twin's
    verdict says nothing of it, so ``_unsharded_twin_fits`` must not lend it."""
    from clustersim.reports import plan_memory

    small = {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1024, "seq_len": 128}
    raw = {"model": small, "cluster": {"preset": "dgx-h100", "gpus": 8},
           "training": {"global_batch": 8, "precision": "fp16", "framework": "deepspeed"},
           "parallel": {"tp": 1, "pp": 1}}
    one, zero = (build_scenario({**raw, "parallel": {**raw["parallel"], "zero": z}})
                 for z in (1, 0))
    assert one.parallel.zero == 1 and zero.parallel.zero == 0
    gained = sum(mem.stage_model_states(zero, 0)) - sum(mem.stage_model_states(one, 0))
    bucket = mem.stage_buffer_bytes(one, 0) - mem.stage_buffer_bytes(zero, 0)
    assert bucket == 500_000_000 * 2 and gained < bucket  # ZeRO-1 needs more here
    key = (shared_memory.verdict_key(one), 0.0)
    shared = {(shared_memory.with_zero(key[0], 0), 0.0): True}
    assert not plan_memory._unsharded_twin_fits(one, key, shared)
