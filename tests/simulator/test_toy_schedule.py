"""A pipeline schedule defined here, outside the package, and registered with one
``register_schedule`` call runs everywhere a shipped one does: the scenario accepts it, both
engine fidelities run its lists, the analytic estimator and the memory model ask it, the
planner tries it (and says Megatron-LM's flags do not run it) and the command line takes it
(docs/extending.md, "A pipeline schedule").
Nothing else in clustersim is edited for it: this file is the whole of the schedule.

The toy runs every forward, then the backwards newest first (last in, first out). On equal
stages with free links its step is GPipe's, ``(m + p - 1)(T_F + T_B)`` (Huang et al. 2019,
sec. 2.2: the bubble ``(p - 1)/(m + p - 1)`` of the step), whatever order the backwards take,
and each stage holds all ``m`` micro-batches' activations at its peak.
"""

from __future__ import annotations

import json

import pytest
import yaml
from cli_helpers import run
from sim_helpers import FAST_HBM, FREE, flat_profile, scenario

import clustersim
from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest, candidates
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.schedules import (
    Action,
    Kind,
    PipelineSchedule,
    Schedule,
    register_schedule,
    unregister_schedule,
)

NAME = "toy-lifo"
M, PP = 8, 4


def last_in_first_out(pp: int, m: int, v: int = 1) -> Schedule:
    """Every forward, then the backwards newest first."""
    return {r: [Action(r, Kind.FORWARD, i) for i in range(m)]
            + [Action(r, Kind.BACKWARD, i) for i in reversed(range(m))] for r in range(pp)}


def all_held(pp: int, m: int, v: int, stage: int) -> list[int]:
    """Every micro-batch's activations are held when the first backward starts."""
    return [m] * v


@pytest.fixture
def toy():
    """The toy, registered for one test (and forgotten after, so that the other tests see
    only the shipped schedules)."""
    yield register_schedule(PipelineSchedule(NAME, last_in_first_out, held=all_held))
    unregister_schedule(NAME)


def gpipe_step(engine: Engine) -> float:
    """GPipe's closed form on equal stages, ``(m + p - 1)(T_F + T_B)``, with one middle
    stage's forward and backward (the last also runs the tiny logits)."""
    work = engine.work[1]
    return (M + PP - 1) * (work.forward + work.backward)


def test_an_unregistered_schedule_is_one_error_naming_the_field():
    with pytest.raises(ScenarioError, match="parallel.schedule.*toy-lifo"):
        scenario(pp=PP, schedule=NAME)


@pytest.mark.parametrize("fidelity", ["representative", "full"])
def test_both_fidelities_run_the_toy_in_gpipes_closed_form(toy, fidelity):
    """Two replicas, so that full fidelity runs every rank of a 4 x 2 grid."""
    s = scenario(layers=8, micro_batches=M, pp=PP, dp=2, schedule=NAME)
    closed = gpipe_step(Engine(s, profile=flat_profile()))
    result = simulate(s, fidelity, flat_profile())
    assert result.step_time_s == pytest.approx(closed, rel=0.005)
    assert result.breakdown.bubble == pytest.approx(closed * (PP - 1) / (M + PP - 1),
                                                         rel=0.05)


def test_the_analytic_estimate_and_the_memory_model_read_what_the_toy_declares(toy):
    """The estimate inherits 1F1B's closed form (``one_f_one_b_finish``), GPipe's on equal
    stages; the memory model reads ``held`` (all m), which the engine's timeline measures, with
    what one backward allocates on top (the last stage's loss gradients)."""
    s = scenario(layers=8, micro_batches=M, pp=PP, schedule=NAME)
    engine = Engine(s, profile=flat_profile())
    simulated = engine.run()
    formula = estimate(s, flat_profile())
    assert formula.step_time_s == pytest.approx(gpipe_step(engine), rel=0.005)
    for i, (sim, closed) in enumerate(zip(simulated.per_stage, formula.per_stage, strict=True)):
        work = engine.work[i]
        assert sim.activations == pytest.approx(
            M * work.activation_bytes + work.transient_bytes, rel=1e-9)
        assert closed.activations == pytest.approx(sim.activations, rel=1e-9)


def test_the_planner_tries_the_toy_and_plans_with_it(toy):
    req = PlanRequest(model={"preset": "llama3-8b"},
                      cluster={"preset": "dgx-h100", "gpus": 32}, global_batch=64)
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    tried = {split["schedule"] for split in candidates(req, base) if split["pp"] > 1}
    assert {"1f1b", "zb-h1", "interleaved", NAME} <= tried
    pinned = {"parallel.schedule": NAME, "parallel.pp": 2, "parallel.tp": 8,
              "parallel.zero": 1, "parallel.recompute": "none", "training.micro_batch": 1}
    plans = clustersim.plan("llama3-8b", "dgx-h100", 16, fix=pinned, global_batch=16,
                            top=1, jobs=1).to_list()
    assert plans[0]["scenario"]["parallel"]["schedule"] == NAME
    # Megatron-LM's flags would run 1F1B: the plan says the toy is not what they run.
    assert any(a.startswith(f"# schedule {NAME}: registered with clustersim")
               for a in plans[0]["plan"]["megatron_args"])
    again = clustersim.simulate(plans[0]["scenario"]).to_dict()
    assert plans[0]["result"]["step_time_s"] == pytest.approx(again["step_time_s"], rel=1e-9)


def test_the_command_line_takes_the_toy(toy, tmp_path, capsys):
    """``clustersim simulate --set parallel.schedule=toy-lifo`` goes through the same
    validation as the file and prints the engine's step."""
    raw = {"model": {"layers": 8, "hidden": 512, "heads": 8, "vocab": 8, "seq_len": 256},
           "cluster": {"preset": "dgx-h100", "gpus": PP, "gpu": FAST_HBM, "intra_node": FREE,
                       "inter_node": FREE},
           "training": {"global_batch": M, "micro_batch": 1},
           "parallel": {"pp": PP}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run(capsys, "simulate", str(path), "--set", f"parallel.schedule={NAME}",
                         "--json")
    assert code == 0, err
    s = build_scenario({**raw, "parallel": {"pp": PP, "schedule": NAME}})
    engine = Engine(s)
    assert json.loads(out)["step_time_s"] == pytest.approx(engine.run().step_time_s, rel=1e-6)
    assert json.loads(out)["breakdown_s"]["bubble"] > 0


def test_a_schedule_with_one_chunk_per_rank_refuses_virtual_stages(toy):
    with pytest.raises(ScenarioError, match="virtual_stages"):
        scenario(layers=8, pp=PP, schedule=NAME, virtual_stages=2)
