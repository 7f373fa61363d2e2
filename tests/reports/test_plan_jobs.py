"""``plan --jobs``: the search and the engine's runs spread over processes give the very answer
of one process, byte for byte (the oracle: the same command with ``--jobs 1``)."""

from __future__ import annotations

import json
import pickle

import pytest
from cli_helpers import run

from clustersim.errors import ScenarioError
from clustersim.reports.plan import PlanRequest
from clustersim.reports.plan_parallel import search_splits, shape_groups
from clustersim.reports.plan_search import candidates
from clustersim.simulator.inputs.scenario import build_scenario

# Two small problems: a dense model whose large micro-batches run out of memory, and a
# mixture of experts (expert parallelism searched) with the pipeline pinned to 4 stages.
PROBLEMS = [
    ["--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "16",
     "--global-batch", "64", "--seq-len", "2048", "--tokens", "1e11", "--top", "3"],
    ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32", "--global-batch", "64",
     "--seq-len", "2048", "--fix", "parallel.pp=4", "--fix", "parallel.recompute=full"],
]


@pytest.mark.parametrize("argv", PROBLEMS, ids=["llama2-7b-16", "mixtral-32-pp4"])
def test_two_processes_print_the_same_json_as_one(capsys, argv):
    one = run(capsys, "plan", *argv, "--json", "--jobs", "1")
    two = run(capsys, "plan", *argv, "--json", "--jobs", "2")
    assert one[0] == 0 and len(json.loads(one[1])) >= 3  # plans found
    assert two == one  # exit status, stdout and stderr, byte for byte


def test_the_merged_search_counts_what_one_process_counts():
    req = PlanRequest(model={"preset": "llama2-13b", "seq_len": 4096},
                      cluster={"preset": "dgx-a100-40gb", "gpus": 16}, global_batch=64)
    one = search_splits(req, keep=20, jobs=1)
    two = search_splits(req, keep=20, jobs=2)
    assert (two.valid, two.fit, two.skipped_memory) == (one.valid, one.fit, one.skipped_memory)
    assert two.out_of_memory == one.out_of_memory
    # best first over two processes estimates every split one process does, and a few
    # batches more (sent before the estimates that rule them out came back)
    assert one.fit - one.skipped_slow <= two.fit - two.skipped_slow < one.fit / 2

    def best(search) -> list[tuple[float, str]]:
        return [(step, s.name) for step, s in sorted(search.fitting, key=lambda p: p[0])[:20]]

    assert best(two) == best(one)


def test_shape_groups_keep_every_micro_batch_of_a_split_together():
    req = PlanRequest(model={"preset": "llama2-7b", "seq_len": 2048},
                      cluster={"preset": "dgx-a100-80gb", "gpus": 16}, global_batch=64)
    base = build_scenario({"model": req.model, "cluster": {**req.cluster, "gpus": 1},
                           "training": {"global_batch": 1}})
    splits = list(candidates(req, base))
    groups = shape_groups(splits)
    assert [s for g in groups for s in g] == splits  # the same splits, in the same order
    shape = ("tp", "cp", "pp", "dp", "ep")
    shapes = [{tuple(s[k] for k in shape) for s in g} for g in groups]
    assert all(len(one) == 1 for one in shapes)
    assert len({next(iter(one)) for one in shapes}) == len(groups)  # each shape in one run


def test_a_scenario_error_survives_the_trip_from_a_worker():
    err = pickle.loads(pickle.dumps(ScenarioError("parallel.tp", "must divide the heads")))
    assert (err.field, err.message) == ("parallel.tp", "must divide the heads")
    assert str(err) == "parallel.tp: must divide the heads"


def test_jobs_below_one_is_one_error_line(capsys):
    code, out, err = run(capsys, "plan", *PROBLEMS[0], "--jobs", "0")
    assert code == 2 and out == "" and err.startswith("error: --jobs")


def test_the_api_refuses_jobs_below_one():
    import clustersim
    with pytest.raises(ScenarioError) as bad:
        clustersim.plan("llama2-7b", "dgx-a100-80gb", 16, jobs=0)
    assert bad.value.field == "jobs"


def test_a_ray_cluster_prints_the_same_plans_as_one_process(capsys):
    """``plan --backend ray``: both passes and the engine's runs on a (local) Ray instance's
    actors, the plans byte for byte one process's."""
    pytest.importorskip("ray")
    one = run(capsys, "plan", *PROBLEMS[0], "--json", "--jobs", "1")
    on_ray = run(capsys, "plan", *PROBLEMS[0], "--json", "--backend", "ray", "--jobs", "2")
    assert on_ray[:2] == one[:2]  # exit status and stdout (Ray logs to stderr)


def test_an_address_without_ray_is_one_error(capsys):
    status, _, err = run(capsys, "plan", *PROBLEMS[0], "--address", "ray://head:10001")
    assert status == 2 and err.strip() == "error: --address: only applies to --backend ray"
