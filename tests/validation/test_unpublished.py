"""A setting a source did not publish is simulated over its candidates, and the run is compared on
the fastest candidate that fits (validation/unpublished.py), in the published tables as in the
development set."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.topologies.profile import profile_for_gpu
from clustersim.validation import published as pub
from clustersim.validation import unpublished

DATA = Path(__file__).resolve().parents[1] / "data"
BASE = {"model": {"layers": 48}, "parallel": {"pp": 4, "schedule": "1f1b", "virtual_stages": 1,
                                               "recompute": "none"}}


def test_interleave_depths_divide_the_layers_per_stage():
    """48 layers on 4 stages: 12 per stage, so depths 2, 3, 4, 6 and 12 besides 1F1B."""
    depths = [(c["parallel"]["schedule"], c["parallel"]["virtual_stages"])
              for c in unpublished.interleave_candidates(BASE)]
    assert depths == [("1f1b", 1)] + [("interleaved", v) for v in (2, 3, 4, 6, 12)]


def test_without_a_pipeline_there_is_nothing_to_interleave():
    flat = unpublished.with_parallel(BASE, pp=1)
    assert unpublished.candidates(flat, ["vpp"]) == [flat]


def test_candidates_start_with_the_scenario_as_written_and_repeat_none():
    written = unpublished.with_parallel(BASE, schedule="interleaved", virtual_stages=3,
                                        recompute="full")
    options = unpublished.candidates(written, ["vpp", "recompute"])
    assert options[0] is written
    assert len(options) == 6 * 3  # 1F1B and five depths, each with three recomputation kinds
    keys = {(o["parallel"]["virtual_stages"], o["parallel"]["recompute"]) for o in options}
    assert len(keys) == len(options)


def test_published_settings_are_not_varied():
    """A setting outside ``unknown_settings`` is the source's: one candidate, as written."""
    assert unpublished.candidates(BASE, ["zero_stage"]) == [BASE]


def test_an_unpublished_micro_batch_is_tried_at_1_2_4_and_8_with_the_other_candidates():
    written = {**BASE, "training": {"global_batch": 64, "micro_batch": 1}}
    options = unpublished.candidates(written, ["micro_batch_size", "recompute"])
    assert options[0] is written
    keys = [(o["training"]["micro_batch"], o["parallel"]["recompute"]) for o in options]
    assert sorted(keys) == sorted((m, k) for m in (1, 2, 4, 8) for k in unpublished.RECOMPUTE)
    assert all(o["training"]["global_batch"] == 64 for o in options)


def test_before_selective_recomputation_existed_it_is_not_a_candidate():
    kinds = [c["parallel"]["recompute"] for c in
             unpublished.recompute_candidates(BASE, unpublished.BEFORE_SELECTIVE)]
    assert kinds == ["none", "full"]


@pytest.mark.parametrize("table", ["megatron2021", "megatron-core-h100"])
def test_a_case_is_compared_on_its_fastest_candidate_that_fits(table):
    """Oracle: every candidate predicted, the fitting ones' fastest step. The comparison skips
    candidates that recompute more than a fitting one of the same schedule; that must not
    change the answer."""
    for case in pub.load_table(DATA / f"{table}.yaml"):
        profile = profile_for_gpu(case.scenario.cluster.gpu.id)
        results = [estimate(s, profile) for s in case.options]
        fitting = [r for r in results if r.fits] or results
        oracle = min(r.step_time_s for r in fitting)
        scenario, result = pub.fastest_fitting(case, profile, estimate)
        assert result.step_time_s == pytest.approx(oracle, rel=1e-12), case.id
        assert scenario in case.options


def test_the_interleaved_schedule_is_tried_where_the_source_did_not_publish_it():
    """Megatron-Core's README names no schedule for its weak-scaling runs: a row with a
    pipeline deep enough is compared on an interleaved candidate, never slower than 1F1B."""
    case = next(c for c in pub.load_table(DATA / "megatron-core-h100.yaml")
                if c.id.endswith("177b"))
    profile = profile_for_gpu("h100-sxm")
    scenario, result = pub.fastest_fitting(case, profile, estimate)
    assert scenario.parallel.schedule == "interleaved"
    assert result.step_time_s < estimate(case.scenario, profile).step_time_s


def test_an_unpublished_micro_batch_is_tried_where_a_replica_has_few_sequences():
    """Megatron-Core's README names no micro-batch; its 32B run has 4 sequences per replica
    (global batch 192 over data-parallel 48). At micro-batch 1 the fp32 gradients'
    reduce-scatter (15.7 GB per GPU) can hide only behind the last micro-batch's backward;
    a larger size gives it more of the backward. The run is compared on a size the batch splits
    into, above 1 and faster than the scenario as written; 8 does not divide 4 and is dropped."""
    case = next(c for c in pub.load_table(DATA / "megatron-core-h100.yaml")
                if c.id.endswith("32b"))
    assert {s.training.micro_batch for s in case.options} == {1, 2, 4}
    profile = profile_for_gpu("h100-sxm")
    scenario, result = pub.fastest_fitting(case, profile, estimate)
    assert scenario.training.micro_batch > 1
    assert result.step_time_s < estimate(case.scenario, profile).step_time_s
