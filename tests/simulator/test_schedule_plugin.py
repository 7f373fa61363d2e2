"""A schedule registered from outside the package runs everywhere a shipped one does: the
scenario accepts it, the engine runs its lists, the memory model, the closed form and the
planner ask it (docs/extending.md, "A pipeline schedule")."""

from __future__ import annotations

import pytest
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest, candidates
from clustersim.simulator import schedules
from clustersim.simulator.analytic import estimate
from clustersim.simulator.engine import Engine
from clustersim.simulator.scenario import build_scenario
from clustersim.simulator.schedules import Action, Kind, PipelineSchedule, register_schedule


def last_in_first_out(pp: int, m: int, v: int = 1) -> schedules.Schedule:
    """Every forward, then the backwards newest first: GPipe's bubble and memory."""
    return {r: [Action(r, Kind.FORWARD, i) for i in range(m)]
            + [Action(r, Kind.BACKWARD, i) for i in reversed(range(m))] for r in range(pp)}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))
    monkeypatch.setattr("clustersim.simulator.parallel_spec.SCHEDULES", schedules.SCHEDULES)
    monkeypatch.setattr("clustersim.reports.plan_search.SCHEDULES", schedules.SCHEDULES)
    return register_schedule(PipelineSchedule(
        "toy-lifo", last_in_first_out, held=lambda pp, m, v, stage: [m] * v))


def test_an_unregistered_schedule_is_one_error_naming_the_field():
    with pytest.raises(ScenarioError, match="parallel.schedule.*toy-lifo"):
        scenario(pp=4, schedule="toy-lifo")


def test_the_engine_runs_a_registered_schedule_with_its_closed_form(toy):
    """Equal stages, free links: GPipe's (m + p - 1)(T_F + T_B), as the closed form the toy
    inherits (``one_f_one_b_finish``) says; the engine's peak holds all m micro-batches, as
    the toy declares and the memory model reads."""
    s = scenario(layers=8, micro_batches=8, pp=4, schedule="toy-lifo")
    engine = Engine(s, profile=flat_profile())
    result = engine.run()
    per_mb = engine.work[1].forward + engine.work[1].backward
    assert result.step_time_s == pytest.approx((8 + 4 - 1) * per_mb, rel=0.01)
    closed = estimate(s, flat_profile())
    assert closed.step_time_s == pytest.approx(result.step_time_s, rel=0.01)
    for i, (sim, formula) in enumerate(zip(result.per_stage, closed.per_stage, strict=True)):
        assert sim.activations == pytest.approx(formula.activations, rel=1e-9)
        assert sim.activations == pytest.approx(8 * engine.work[i].activation_bytes, rel=1e-9)


def test_the_planner_tries_a_registered_schedule(toy):
    req = PlanRequest(model={"preset": "llama3-8b"},
                      cluster={"preset": "dgx-h100", "gpus": 32}, global_batch=64)
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    tried = {split["schedule"] for split in candidates(req, base) if split["pp"] > 1}
    assert {"1f1b", "zb-h1", "interleaved", "toy-lifo"} <= tried


def test_a_schedule_with_one_chunk_per_rank_refuses_virtual_stages(toy):
    with pytest.raises(ScenarioError, match="virtual_stages"):
        scenario(layers=8, pp=4, schedule="toy-lifo", virtual_stages=2)
