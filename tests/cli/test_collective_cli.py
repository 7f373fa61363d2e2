"""``clustersim collective``: nccl-tests' table from the simulator, and its bad input."""

from __future__ import annotations

import json

import pytest

from clustersim.cli import main
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import bus_bandwidth
from clustersim.topologies.profile import profile_for_gpu


def test_rows_from_min_to_max_by_the_factor_with_the_librarys_bus_bandwidth(capsys):
    assert main(["collective", "allreduce", "--cluster", "dgx-h100", "--gpus", "32",
                 "--min-bytes", "1M", "--max-bytes", "1G", "--factor", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["size_bytes"] for r in rows] == [2**20 * 4**k for k in range(6)]
    cluster = build_cluster({"preset": "dgx-h100", "gpus": 32})
    expected = bus_bandwidth(cluster, profile_for_gpu("h100-sxm"), "allreduce", 32, 2**30)
    assert rows[-1]["busbw_GBps"] == pytest.approx(expected / 1e9)
    assert rows[-1]["algbw_GBps"] == pytest.approx(rows[-1]["busbw_GBps"] * 32 / 62)


def test_table_is_printed_like_nccl_tests(capsys):
    assert main(["collective", "alltoall", "--cluster", "dgx-a100-80gb", "--gpus", "16",
                 "--min-bytes", "8G", "--max-bytes", "8G"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# alltoall over 16 x a100-80gb")
    assert "busbw (GB/s)" in out[1] and len(out) == 3


@pytest.mark.parametrize("argv, field", [
    (["--gpus", "12"], "--gpus"),
    (["--gpus", "1"], "--gpus"),
    (["--gpus", "16", "--min-bytes", "1X"], "--min-bytes"),
    (["--gpus", "16", "--min-bytes", "1G", "--max-bytes", "1M"], "--max-bytes"),
    (["--gpus", "16", "--factor", "1"], "--factor"),
])
def test_bad_input_is_one_error_line(argv, field, capsys):
    assert main(["collective", "allreduce", "--cluster", "dgx-h100", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}")
