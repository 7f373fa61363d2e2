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


def test_a_measured_log_is_printed_beside_the_prediction_with_the_fraction_that_reproduces_it(
        tmp_path, capsys):
    """A log of the model's own bus bandwidths at 40% of the NICs' line rate (as nccl-tests
    prints them) gives 0.4 back, for the cluster file's ``inter_node.efficiency``."""
    cluster = build_cluster({"preset": "dgx-a100-80gb", "gpus": 32,
                             "inter_node": {"bandwidth": 25, "latency": 5e-6,
                                            "efficiency": 0.4}})
    profile = profile_for_gpu("a100-80gb")
    rows = [f"{n:12d} {n // 4:12d} float sum -1 1.0 1.0 "
            f"{bus_bandwidth(cluster, profile, 'allreduce', 32, n, 'representative') / 1e9:.4f}"
            " 0" for n in (2**20, 2**30)]
    log = tmp_path / "all_reduce_perf.log"
    log.write_text("#  size count type redop root time algbw busbw #wrong\n" + "\n".join(rows))
    assert main(["collective", "allreduce", "--cluster", "dgx-a100-80gb", "--gpus", "32",
                 "--fidelity", "representative", "--measured", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in out["rows"]] == [2**20, 2**30]
    assert out["rows"][1]["measured_busbw_GBps"] == pytest.approx(
        out["rows"][1]["busbw_GBps"] * 0.4 / 0.91, rel=0.01)
    fit = out["measured_fit"]
    assert fit["tier"] == "inter_node" and fit["efficiency_in_use"] == pytest.approx(0.91)
    assert fit["efficiency"] == pytest.approx(0.4, rel=2e-3)
    assert main(["collective", "allreduce", "--cluster", "dgx-a100-80gb", "--gpus", "32",
                 "--fidelity", "representative", "--measured", str(log)]) == 0
    assert "set cluster.inter_node.efficiency: 0.400" in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, "# nothing measured here\n"])
def test_a_measured_log_that_cannot_be_read_is_one_error_line(content, tmp_path, capsys):
    log = tmp_path / "missing.log"
    if content is not None:
        log.write_text(content)
    assert main(["collective", "allreduce", "--cluster", "dgx-h100", "--gpus", "16",
                 "--measured", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --measured")
