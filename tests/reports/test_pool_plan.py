"""The planner on a cluster of pools: it places stages on pools, balances their layers towards
the faster GPUs, and compares the best mixed plan with the fastest pool alone.

Oracles: 8 H100s are about 25 A100s of bf16 peak (989.4 / 312 TFLOP/s, gpus.yaml), so
joining 64 A100s to them should beat the 8 H100s alone, by well under the ideal
(8 x 989.4 + 64 x 312) / (8 x 989.4) = 3.5x; a 70B model cannot fit 8 GPUs of 80 GB at all
(16 bytes per parameter of Adam's model states, ZeRO paper sec. 3.1: 70e9 x 16 / 8 = 140 GB).
"""

from __future__ import annotations

import json

import pytest

from clustersim.cli import main
from clustersim.reports.plan import PlanRequest
from clustersim.reports.plan_request import make_request, search
from clustersim.simulator.pipeline.stages import stage_layers

H100_A100 = {"pools": [{"preset": "dgx-h100", "gpus": 8}, {"preset": "dgx-a100-80gb", "gpus": 64}]}
NARROW = {"parallel.tp": 1, "training.micro_batch": 1, "parallel.schedule": "1f1b",
          "parallel.zero": 1, "parallel.recompute": "none"}


def test_a_small_fast_pool_gains_from_the_slow_one_and_gets_more_layers_per_stage():
    req = make_request("gpt-1.7b", H100_A100, None, global_batch=256, fixed=NARROW)
    found = search(req, top=3)
    best, alone = found.best, found.fastest_pool_alone
    assert best is not None and alone is not None and alone.best is not None
    assert (alone.pool, alone.gpus, alone.gpu) == (0, 8, "h100-sxm")
    ratio = alone.best.result.step_time_s / best.result.step_time_s
    assert 1.5 < ratio < 3.5
    layers, pools = stage_layers(best.scenario), best.scenario.parallel.stage_pools
    fast = [n for n, k in zip(layers, pools, strict=True) if k == 0]
    slow = [n for n, k in zip(layers, pools, strict=True) if k == 1]
    assert min(fast) > max(slow)  # the H100 stage carries more layers than any A100 stage
    assert best.result.gpus == 72


def test_a_model_too_big_for_the_fast_pool_alone_fits_the_mixed_cluster(capsys, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(json.dumps({"cluster": H100_A100}))
    fix = ["parallel.tp=8", "training.micro_batch=1", "parallel.schedule=1f1b",
           "parallel.zero=0", "parallel.recompute=full"]
    argv = ["plan", "--model", "llama3-70b", "--cluster", str(path), "--global-batch", "64",
            "--json"] + [a for f in fix for a in ("--fix", f)]
    assert main(argv) == 0
    plans = json.loads(capsys.readouterr().out)
    assert plans and all(p["result"]["memory"]["fits"] for p in plans)
    alone = plans[0]["plan"]["fastest_pool_alone"]
    assert alone == {"pool": 0, "gpus": 8, "gpu": "h100-sxm", "step_time_s": None,
                     "split": None}
    assert plans[0]["scenario"]["parallel"]["stage_pools"] in ([0] + [1] * 8, [1] * 8 + [0])


def test_the_table_shows_each_stages_pool_and_layers_and_the_comparison(capsys, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(json.dumps({"cluster": H100_A100}))
    fix = [a for k, v in NARROW.items() for a in ("--fix", f"{k}={v}")]
    assert main(["plan", "--model", "gpt-1.7b", "--cluster", str(path), "--global-batch",
                 "256", "--top", "2", *fix]) == 0
    out = capsys.readouterr().out
    assert "8 x h100-sxm (dgx-h100) + 64 x a100-80gb (dgx-a100-80gb)" in out
    assert "stages (pool:layers)" in out and " 0:" in out and " 1:" in out
    assert "Fastest pool alone (pool 0: 8 x h100-sxm):" in out and "x faster, on 72 GPUs" in out
    assert "# stages on pools [" in out  # with the Megatron-LM arguments, how to place them


@pytest.mark.parametrize("gpus, cluster, why", [
    (None, {"preset": "dgx-h100"}, "--gpus: give the GPUs to plan for"),
    (64, H100_A100, "--gpus: the cluster's pools hold 72 GPUs"),
])
def test_gpu_count_mistakes_are_one_error(capsys, tmp_path, gpus, cluster, why):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"cluster": cluster}))
    argv = ["plan", "--model", "gpt-1.7b", "--cluster", str(path)]
    code = main(argv + (["--gpus", str(gpus)] if gpus else []))
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith(f"error: {why}") and len(err.splitlines()) == 1


def test_a_plain_cluster_request_is_unchanged():
    """Without pools the request still carries --gpus as the cluster's size."""
    req = make_request("gpt-1.7b", "dgx-h100", 16, global_batch=64)
    assert isinstance(req, PlanRequest) and req.cluster == {"preset": "dgx-h100", "gpus": 16}


def test_the_python_api_plans_a_cluster_of_pools_without_a_gpu_count():
    import clustersim

    found = clustersim.plan("gpt-1.7b", H100_A100, fix=NARROW, global_batch=256, top=1)
    entry = found.to_list()[0]
    assert entry["result"]["gpus"] == 72
    assert entry["plan"]["fastest_pool_alone"]["gpu"] == "h100-sxm"
    assert entry["plan"]["fastest_pool_alone"]["step_time_s"] > entry["result"]["step_time_s"]


def test_a_pinned_depth_whose_stages_split_a_pool_says_which(capsys, tmp_path):
    """pp 2 over 8 + 64 GPUs makes stages of 36 GPUs, which 8 H100s cannot hold whole."""
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"cluster": H100_A100}))
    code = main(["plan", "--model", "gpt-1.7b", "--cluster", str(path), "--global-batch", "288",
                 "--fix", "parallel.pp=2"])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: cluster.pools: pool 0 (dgx-h100) has 8 GPUs, not whole stages")
