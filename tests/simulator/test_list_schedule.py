"""``list_schedule.py`` is how the closed form times every schedule without a formula: the same
action lists the engine walks, run in order with the stage costs (docs/architecture.md, "Each
behaviour in one place"). On equal stages with free communication the two must end each stage
at the same instant."""

from __future__ import annotations

import pytest
from sim_helpers import flat_profile, scenario

from clustersim.simulator.closed_form.analytic import stage_times
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.schedules import SCHEDULES, schedule_named

# Every shipped schedule whose closed-form finish is read off its lists by list scheduling.
LIST_SCHEDULED = sorted(name for name, sc in SCHEDULES.items()
                        if sc.finish.__qualname__.startswith("list_scheduled_finish."))

# The engine times each chunk by its own layers; the closed form splits a stage's time evenly
# over its chunks. On ``scenario``'s equal stages the only uneven chunk is the one holding the
# 8-word output layer (about 1e-4 of a stage's time, sim_helpers.scenario) and the embedding,
# and a pipeline send on its free links takes about 1e-13 s: measured, the finish times agree
# within 2.4e-5 (ZB-V, whose V puts the output layer on stage 0 beside the first chunk), 1e-5
# (DualPipe, DualPipeV) and 1e-8 where each stage holds one chunk (ZB-H2). 1e-4 bounds the
# output layer's share; swapping two actions of one rank's list moves them by 2e-3 to 1.5e-2.
REL = 1e-4


def test_the_list_scheduled_schedules_are_the_ones_without_a_formula():
    """Zero-bubble H2, ZB-V, DualPipe, DualPipeV and combined 1F1B have no closed form for
    their finish."""
    assert LIST_SCHEDULED == ["combined-1f1b", "dualpipe", "dualpipev", "zb-h2", "zb-v"]


def _finish_times(name: str, pp: int, m: int) -> tuple[list[float], list[float], float]:
    """(closed form, engine): when each stage ends the step, stage by stage; and the step
    without a bubble, each stage's micro-batches back to back and its optimizer step."""
    sc = schedule_named(name)
    v = sc.chunk_counts[0] if sc.chunk_counts else 2 if name == "combined-1f1b" else 1
    s = scenario(layers=8 * pp, micro_batches=m, pp=pp, schedule=name, virtual_stages=v)
    profile = flat_profile()
    costs = StageCosts(s, profile)
    message = wl.pipeline_message_bytes(s)
    stages = [stage_times(costs.stage(i), i, costs.stage_send_links(i, message))
              for i in range(pp)]
    closed = sc.finish(stages, s.microbatches, v)
    engine = Engine(s, profile=profile)
    ends = dict(zip((r.stage for r in engine.ranks), (t.finish for t in engine.totals()),
                    strict=True))
    busy = max(m * st.per_microbatch + st.grad_sync + st.optimizer for st in stages)
    return closed, [ends[i] for i in range(pp)], busy


@pytest.mark.parametrize("name", LIST_SCHEDULED)
@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 16), (8, 16), (8, 24)])
def test_closed_form_finish_times_match_the_engine_on_equal_free_stages(name, pp, m):
    closed, engine, busy = _finish_times(name, pp, m)
    assert closed == pytest.approx(engine, rel=REL)
    # ... and not trivially: the lists leave a bubble, larger than the tolerance, to time
    assert max(engine) - busy > 10 * REL * max(engine)
