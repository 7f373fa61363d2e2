"""The accuracy report at the default fidelity, computed once for the module: the held-out
development set's guards (published runs: tests/data/published-dev.yaml, each with its source),
and the README's and docs/accuracy.md's generated blocks, which must be what the report
renders now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustersim.validation import accuracy, devset

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

# Per held-out source: (mean |error|, |signed mean|) of the iteration time must stay below
# these. Set a little above the engine's level when last changed (issue 23, 2026-11-27: the
# A100's two overheads fitted on Narayanan et al.'s Table 1 as its authors' scripts ran it,
# micro-batches and interleave depths from Megatron-LM examples/sc21, tests/data/
# megatron2021.yaml; sustained fraction 0.784 -> 0.777, step overhead 0 -> 0.025 s):
# bloom-176b 6.1% (-6.1%), bloom-topology-sweep 9.1% (-8.0%), korthikanti2022-end-to-end
# 7.1% (+7.1%), vtrain-multi-node 8.6% (+0.2%); before it (the table's unpublished settings
# at their fastest candidates) 6.9% (-6.9%), 9.5% (-8.8%), 6.2% (+5.8%) and 8.4% (-0.8%).
# A regression guard, not the goal (issue 23: <= 6% per source on average, every signed mean
# within 5%); tighten as the cost model improves.
DEV_TOLERANCES = {
    "bloom-176b": (0.08, 0.08),
    "bloom-topology-sweep": (0.105, 0.10),
    "korthikanti2022-end-to-end": (0.07, 0.07),
    "vtrain-multi-node": (0.09, 0.02),
}
# Fit/OOM outcomes predicted wrong: 2 of 24 when written (issue 23's goal: none). Counted as
# disagreements, so a source that moves to the fitted side cannot fail it.
MAX_MEMORY_DISAGREEMENTS = 2
MIN_PAIRS_IN_ORDER = 0.83  # 1290 of 1538 ranked pairs when written
MAX_MEAN_REGRET = 0.07  # 6.0% when written
# vTrain's single-node runs (held out, scored apart): mean |error| 14.9%, signed -5.8%, 8226 of
# 9372 pairs in order (87.8%), mean regret 4.5% when added (2026-11-29) under the fastest host's
# floor; 10.5%, +3.8%, 90.7% and 5.1% under the median host's (host_layer_s, the same day).
# A regression guard.
SINGLE_NODE_LIMITS = {"mean_abs": 0.115, "signed": 0.05, "pairs_in_order": 0.895, "regret": 0.06}


@pytest.fixture(scope="module")
def report() -> accuracy.AccuracyReport:
    return accuracy.collect(DATA, "representative")


@pytest.fixture(scope="module")
def dev_score(report) -> devset.DevScore:
    return devset.score(report.dev_held_out)


def test_readme_and_docs_blocks_are_what_the_report_renders(report):
    stale = accuracy.stale_files(report, ROOT)
    assert not stale, (f"{', '.join(str(p.relative_to(ROOT)) for p in stale)} out of date: run "
                       f"python3 benchmarks/accuracy.py --write-readme")


def test_every_held_out_source_is_guarded_and_within_its_tolerance(dev_score):
    over = []
    for source in dev_score.sources:
        assert source.source in DEV_TOLERANCES, f"no tolerance for {source.source}"
        mean_limit, signed_limit = DEV_TOLERANCES[source.source]
        if source.mean_abs >= mean_limit or abs(source.signed) >= signed_limit:
            over.append(f"{source.source}: mean |error| {source.mean_abs:.3f} (< {mean_limit}), "
                        f"signed {source.signed:+.3f} (within {signed_limit})")
    assert not over, "; ".join(over)


def test_fit_and_oom_outcomes_disagree_no_more_than_before(dev_score):
    wrong = dev_score.memory_total - dev_score.memory_agree
    assert wrong <= MAX_MEMORY_DISAGREEMENTS, (dev_score.memory_agree, dev_score.memory_total)


def test_ranking_within_jobs_no_worse_than_before(dev_score):
    rank = dev_score.ranking
    assert rank.right / rank.pairs >= MIN_PAIRS_IN_ORDER, (rank.right, rank.pairs)
    assert sum(rank.regrets) / len(rank.regrets) <= MAX_MEAN_REGRET, rank.regrets


def test_vtrain_single_node_runs_no_worse_than_when_added(report):
    score = devset.score(report.single_node)
    (source,), rank = score.sources, score.ranking
    limits = SINGLE_NODE_LIMITS
    assert source.runs == 1440
    assert source.mean_abs < limits["mean_abs"] and abs(source.signed) < limits["signed"], source
    assert rank.right / rank.pairs >= limits["pairs_in_order"], (rank.right, rank.pairs)
    assert sum(rank.regrets) / len(rank.regrets) <= limits["regret"], rank.regrets


def test_no_held_out_comparison_used_a_profile_fitted_on_it(report):
    """The rule the report is built on, checked on its output against the shipped profile
    files themselves: no held-out table row, development run or vTrain single-node run was
    predicted by a profile whose ``fitted_on`` names its table or source."""
    fitted_on = {}
    for path in (ROOT / "topologies" / "profiles").glob("*.json"):
        profile = json.loads(path.read_text())
        fitted_on[profile["name"]] = set(profile.get("fitted_on", []))
    for row in report.held_out_rows:
        assert row.case.table not in fitted_on[row.profile], row.case.id
    for r in (*report.dev_held_out, *report.single_node):
        assert not {r.run.source, "published-dev"} & fitted_on[r.profile.name], r.run.id


def test_a_block_is_replaced_between_its_markers_only():
    text = "before\n<!-- accuracy:begin -->\nold\n<!-- accuracy:end -->\nafter\n"
    new = accuracy.replace_block(text, "accuracy", "new\n")
    assert new == "before\n<!-- accuracy:begin -->\nnew\n<!-- accuracy:end -->\nafter\n"
    assert accuracy.read_block(new, "accuracy") == "new\n"
    with pytest.raises(ValueError, match="markers"):
        accuracy.replace_block("no markers", "accuracy", "new\n")


def _timed(pp: int, tp: int, published: float, predicted: float) -> devset.DevResult:
    run = devset.DevRun(id=f"pp{pp}-tp{tp}", source="made-up", job=(),
                        candidates=({"parallel": {"pp": pp, "tp": tp}},),
                        published_s=published, oom=None)
    return devset.DevResult(run, predicted, True, None)


def test_the_bias_table_groups_runs_by_their_split_and_names_each_group_by_its_values():
    """Worked by hand: pp 1 predicted 10% fast; pp 12 and 24 (one group, 8-31) 20% slow and
    even; pp 64 exactly. A run with no published time is left out."""
    results = (_timed(1, 8, 10.0, 9.0), _timed(12, 4, 10.0, 12.0), _timed(24, 4, 10.0, 10.0),
               _timed(64, 8, 10.0, 10.0),
               devset.DevResult(devset.DevRun("oom", "made-up", ({"parallel": {"pp": 2, "tp": 1}},),
                                              (), None, True), 1.0, False, None))
    table = accuracy.bias_table(results, "pipeline stages")
    assert table.header == ["pipeline stages", "runs", "mean |error|", "signed mean", "worst"]
    assert table.rows == [["1", "1", "10.0%", "-10.0%", "10.0%"],
                          ["12-24", "2", "10.0%", "+10.0%", "20.0%"],
                          ["64", "1", "0.0%", "+0.0%", "0.0%"]]
    by_tp = accuracy.bias_table(results, "tensor-parallel size")
    assert [row[:2] for row in by_tp.rows] == [["4", "2"], ["8", "2"]]
