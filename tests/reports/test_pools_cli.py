"""``clustersim simulate`` on a cluster of pools: its table and JSON, and each mistake in a
pooled scenario as one ``error:`` line naming the field, exit status 2 (SCENARIO.md)."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run

from clustersim.topologies.hardware import GpuSpec, gpu_presets

MIXED = """\
model: {preset: gpt-1.7b}
cluster:
  pools:
    - {preset: dgx-h100, gpus: 16}
    - {preset: dgx-a100-80gb, nodes: 2}
training: {global_batch: 64, micro_batch: 1}
parallel: {tp: 1, pp: 2}
"""


@pytest.fixture
def mixed(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    return path


def test_the_json_result_names_each_stages_pool(capsys, mixed):
    code, out, err = run(capsys, "simulate", str(mixed), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["gpus"] == 32
    stages = result["memory"]["per_stage"]
    assert [(st["stage"], st["pool"]) for st in stages] == [(0, 0), (1, 1)]
    h100, a100 = (GpuSpec.model_validate({**gpu_presets()[g], "id": g}).tensor_memory_bytes
                  for g in ("h100-sxm", "a100-80gb"))  # gpus.yaml, less the runtime
    assert [st["capacity_bytes"] for st in stages] == [h100, a100]
    assert result["memory"]["capacity_bytes"] == min(h100, a100)  # the smaller of the two


def test_the_table_names_the_pools_and_their_stages(capsys, mixed):
    code, out, _ = run(capsys, "simulate", str(mixed))
    assert code == 0
    assert "16 x h100-sxm (dgx-h100) + 16 x a100-80gb (dgx-a100-80gb)" in " ".join(out.split())
    assert "stages on pools [0, 1], layers [12, 12]" in out


BAD = {
    "unknown-pool": (["parallel.stage_pools=[0, 2]"], "parallel.stage_pools", "unknown pool 2"),
    "stage-not-fitting-a-pool": (["parallel.pp=4", "parallel.stage_pools=[0, 0, 0, 1]"],
                                 "parallel.stage_pools", "16 GPUs but gets 3 stage(s)"),
    "pools-not-summing": (["cluster.gpus=48"], "cluster.gpus", "16 + 16 = 32"),
    "pool-not-whole-stages": (["parallel.pp=1"], "cluster.pools",
                              "16 GPUs, not whole stages of tp*cp*dp = 32 GPUs"),
    "negative-sigma": (["cluster.pools=[{preset: dgx-h100, gpus: 16, variability: "
                        "{compute_sigma: -0.1}}, {preset: dgx-a100-80gb, gpus: 16}]"],
                       "cluster.pools.0.variability.compute_sigma", "greater than or equal"),
    "unknown-pool-preset": (["cluster.pools=[{preset: dgx-q, gpus: 16}]"],
                            "cluster.pools.0.preset", "unknown preset 'dgx-q'"),
    "key-beside-pools": (["cluster.preset=dgx-h100"], "cluster.preset", "inside each pool"),
    "stage-pools-without-pools": (["cluster={preset: dgx-h100, gpus: 32}",
                                   "parallel.stage_pools=[0, 0]"], "parallel.stage_pools",
                                  "needs a cluster made of pools"),
    "pp-not-outermost": (["parallel.order=pp-tp-cp-dp"], "parallel.order", "pp outermost"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_pooled_mistake_is_one_error_line_and_exit_2(capsys, mixed, kind):
    sets, field, why = BAD[kind]
    argv = ["simulate", str(mixed), "--json"] + [a for s in sets for a in ("--set", s)]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {field}: ") and why in err, err


@pytest.mark.parametrize("argv, field", [(["simulate", "--fidelity", "full"], "fidelity"),
                                         (["simulate", "--samples", "3"], "samples"),
                                         (["validate"], "cluster.pools")])
def test_what_pools_do_not_support_yet_is_refused(capsys, mixed, argv, field):
    """Full fidelity routes one fabric of one kind of node; --samples draws one GPU's
    profile; a real run uses one machine's devices: each refuses a cluster of pools rather
    than answer for a uniform one."""
    code, out, err = run(capsys, argv[0], str(mixed), *argv[1:])
    assert (code, out) == (2, "") and err.startswith(f"error: {field}: ")
    assert "pools" in err and len(err.splitlines()) == 1


def test_a_sweep_of_the_split_places_each_points_stages_afresh(capsys, mixed, tmp_path):
    """The file pins stage_pools for pp 2; a point at pp 4 re-derives it (as it does dp)."""
    text = mixed.read_text().replace("pp: 2}", "pp: 2, stage_pools: [0, 1]}")
    mixed.write_text(text)
    out = tmp_path / "sweep.csv"
    code, _, err = run(capsys, "sweep", str(mixed), "--grid", "parallel.pp=2,4", "--out", str(out))
    assert code == 0, err
    import pandas as pd

    rows = pd.read_csv(out)
    assert list(rows["status"]) == ["ok", "ok"]
    pools = [json.loads(s)["parallel"]["stage_pools"] for s in rows["scenario"]]
    assert pools == [[0, 1], [0, 0, 1, 1]]
