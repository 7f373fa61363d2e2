"""The planner's cheap bounds (``plan_bound.step_floor_s``: weight GEMMs at the datasheet peak
plus the schedule's unavoidable bubble; ``end_stages_floor_s``: ``m`` times an end stage's
forward and backward) are true lower bounds of the closed-form step that ranks the splits
(and of the engine's step of each plan), and pruning by them never changes the plans: on
three benchmark problems the pruned search's top plans are an exhaustive search's (the
oracle: ``prune=False``)."""

from __future__ import annotations

import functools

import pytest

from clustersim.reports.plan import PlanRequest, plan
from clustersim.reports.plan_bound import compute_floor_s, end_stages_floor_s, step_floor_s
from clustersim.reports.plan_parallel import search_splits
from clustersim.reports.plan_search import SplitSearch
from clustersim.simulator.closed_form.analytic import estimate, stage_times
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.model import workload as wl

KEEP = 20  # the shortlist of plan(top=5): 4 x top
PROBLEMS = {
    "llama2-7b-16": PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                                cluster={"preset": "dgx-a100-80gb", "gpus": 16},
                                global_batch=64),
    # GPT-3 on 64 A100 with the tensor parallelism and ZeRO stage pinned (--fix)
    "gpt3-175b-64": PlanRequest(model={"preset": "gpt3-175b", "seq_len": 2048},
                                cluster={"preset": "dgx-a100-80gb", "gpus": 64},
                                global_batch=128,
                                fixed={"parallel.tp": 8, "parallel.zero": 1}),
    # a mixture of experts, expert parallelism searched, ZeRO-1 pinned to keep the test short
    "mixtral-8x7b-32": PlanRequest(model={"preset": "mixtral-8x7b", "seq_len": 4096},
                                   cluster={"preset": "dgx-h100", "gpus": 32},
                                   global_batch=64, fixed={"parallel.zero": 1}),
}


@functools.cache
def _exhaustive(name: str) -> SplitSearch:
    return search_splits(PROBLEMS[name], KEEP, prune=False)


@pytest.mark.parametrize("name", PROBLEMS)
def test_the_floor_is_below_every_estimate_and_pruning_keeps_the_top_plans(name):
    req = PROBLEMS[name]
    exhaustive = _exhaustive(name)
    assert len(exhaustive.fitting) > 100 and exhaustive.skipped_slow == 0
    for step, s in exhaustive.fitting:  # every split the exhaustive search evaluated
        assert step_floor_s(s) <= step, s.name
        assert end_stages_floor_s(s, StageCosts(s)) <= step, s.name
    pruned = search_splits(req, KEEP, prune=True)
    assert pruned.skipped_floor > 0  # the floor did prune
    assert (pruned.valid, pruned.fit) == (exhaustive.valid, exhaustive.fit)

    def best(search) -> list[tuple[float, str]]:
        return [(step, s.name) for step, s in sorted(search.fitting, key=lambda p: p[0])[:KEEP]]

    assert best(pruned) == best(exhaustive)  # the same shortlist reaches the engine
    fast, _, _ = plan(req, top=5, caveats=False)
    slow, _, _ = plan(req, top=5, prune=False, caveats=False)
    assert [p.scenario.name for p in fast] == [p.scenario.name for p in slow]
    assert [p.result.step_time_s for p in fast] == [p.result.step_time_s for p in slow]
    for p in fast:  # the engine's step too is above both bounds
        assert step_floor_s(p.scenario) <= p.result.step_time_s
        assert end_stages_floor_s(p.scenario, StageCosts(p.scenario)) <= p.result.step_time_s


def test_without_a_pipeline_the_end_stage_bound_is_the_step_less_what_runs_once():
    """One stage under 1F1B with the data-parallel reduction once a step (ZeRO 0 or 1): the
    closed form is ``m (forward + backward + comm) + grad_sync + optimizer``
    (``schedules.one_f_one_b_finish`` with one stage), so the bound, ``m`` micro-batches of
    compute and exposed TP/CP/EP collectives, is the step less its once-a-step parts: the
    collectives are in it (a bound of the compute alone falls short by ``m comm``)."""
    compared = 0
    for step, s in _exhaustive("llama2-7b-16").fitting:
        if s.parallel.pp > 1 or s.parallel.zero > 1:
            continue
        costs = StageCosts(s)
        once = stage_times(costs.stage(0), 0)
        bound = end_stages_floor_s(s, costs)
        assert bound == pytest.approx(step - once.grad_sync - once.optimizer, rel=1e-12), s.name
        compared += once.comm > 0
    assert compared > 10  # splits with exposed collectives (tp > 1) were among them


def test_the_estimate_is_the_step_the_search_ranks_by():
    """The floor is checked against the search's steps above; they are the estimator's."""
    search = _exhaustive("llama2-7b-16")
    for step, s in sorted(search.fitting, key=lambda p: p[0])[:3]:
        assert estimate(s).step_time_s == pytest.approx(step, rel=1e-12)


def test_the_compute_floor_is_the_weight_gemms_at_the_peak():
    """Hand count for a dense model (Narayanan et al. 2021, eq. 3, without the attention
    square): per sequence ``24 s h^2 l (1 + ...)`` for the layers' GEMMs; here llama2-7b's
    projections (4 h^2, no GQA) and SwiGLU MLP (3 h f), ``2 s`` FLOPs per weight, plus the
    output layer ``2 s h V``; times 3 for backward, the batch, over GPUs and the bf16 peak."""
    s = _exhaustive("llama2-7b-16").fitting[0][1]
    m, h, f, v, seq = 32, 4096, 11008, 32000, 2048
    per_sequence = 2 * seq * m * (4 * h * h + 3 * h * f) + 2 * seq * h * v
    expected = 3 * per_sequence * 64 / 16 / s.cluster.gpu.peak_flops["bf16"]
    assert compute_floor_s(s) == pytest.approx(expected, rel=1e-12)
    assert compute_floor_s(s) < wl.model_flops_per_step(s) / 16 / s.cluster.gpu.peak_flops["bf16"]
