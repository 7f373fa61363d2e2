"""vTrain's single-node runs (tests/data/vtrain-single-node.yaml) as held-out runs: the file is
vTrain's table, each row becomes a scenario by the development set's vTrain rules, and the
accuracy report scores them apart from the development set."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.validation import accuracy, devset, vtrain_single
from clustersim.yamlio import load_yaml_file

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


@pytest.fixture(scope="module")
def table() -> dict:
    return load_yaml_file(DATA / vtrain_single.FILE)


@pytest.fixture(scope="module")
def runs() -> list[devset.DevRun]:
    return vtrain_single.load_runs(DATA / vtrain_single.FILE)


def test_the_file_is_vtrains_table_of_1440_single_node_runs(table):
    """data/ground_truth_single.csv @ f8dda847: 1,440 rows; each split fills its GPUs and each
    rank's batch is whole micro-batches; at most one 8-GPU node."""
    rows = [dict(zip(vtrain_single.COLUMNS, r, strict=True)) for r in table["rows"]]
    assert len(rows) == 1440 and "f8dda8473a48b373b1d25f51f52d685bff5150c5" in table["source"]
    for r in rows:
        assert r["tp"] * r["dp"] * r["pp"] == r["gpus"] <= 8, r
        assert r["global_batch"] % (r["dp"] * r["micro_batch"]) == 0, r
        assert r["iteration_time_ms"] > 0
    assert {r["hidden"] for r in rows} == {1024, 2048}
    # the first row as the CSV prints it
    assert table["rows"][0] == [2, 16, 8, 1024, 16, 24, 1024, 1, 1, 2, 372.160408]


def test_each_row_is_a_scenario_by_the_development_sets_vtrain_rules(runs):
    """No FlashAttention, no gradient bucketing (vTrain's configs), full recomputation and 1F1B
    as its configs set, the A100's DGX preset; the published time in seconds."""
    assert len(runs) == 1440
    for run in runs[:50]:
        (scenario,) = run.candidates
        assert scenario["cluster"]["preset"] == "dgx-a100-80gb"
        assert scenario["training"]["flash_attention"] is False
        assert scenario["parallel"]["overlap_grad_reduce"] is False
        assert scenario["parallel"]["recompute"] == "full"
        assert scenario["parallel"]["schedule"] == "1f1b"
        assert run.source == vtrain_single.SOURCE
    assert runs[0].published_s == pytest.approx(0.372160408)


def test_runs_of_one_model_gpu_count_and_batch_form_one_job(runs):
    """A job is one model (layers, width) on one GPU count at one global batch; its runs are
    the splits and micro-batches the planner would choose between, each once."""
    same = [r for r in runs if r.job == runs[0].job]
    assert runs[0].job == ("vtrain", 24, 1024, 2, 16) and len(same) > 1

    def split(run: devset.DevRun) -> tuple[int, int, int, int]:
        p, t = run.candidates[0]["parallel"], run.candidates[0]["training"]
        return p["tp"], p["pp"], p["dp"], t["micro_batch"]
    assert len({split(r) for r in same}) == len(same)


def test_a_row_that_is_not_a_scenario_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("source: x\nsettings: {gpu: V100, recompute: full, schedule: 1F1B, "
                    "gpus_per_node: 8}\ncolumns: [" + ", ".join(vtrain_single.COLUMNS) + "]\n"
                    "rows:\n  - [2, 16, 8, 1024, 16, 24, 1024, 1, 1, 2, 372.1]\n")
    with pytest.raises(ValueError, match="not a scenario"):
        vtrain_single.load_runs(path)


def test_the_report_scores_them_apart_from_the_development_set():
    """Held out (no profile names the source), in the report's own section, and not mixed
    into the development set's per-source table."""
    runs = vtrain_single.load_runs(DATA / vtrain_single.FILE)[:40]
    results = devset.predict_runs(runs, accuracy.predictor("analytic"))
    held, fitted = accuracy.split_dev(results)
    assert len(held) == 40 and not fitted
    line = accuracy.single_node_line(tuple(held), "closed-form estimate", "")
    assert line.startswith("Held out: vTrain's single-node runs (vtrain-single-node.yaml")
    assert "40 timed runs" in line
