"""nccl-tests output read back, and the fraction of a tier's line rate that reproduces it: a log
made by the model at a known fraction gives that fraction back."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.simulator.network.bus_bandwidth import bus_bandwidth
from clustersim.simulator.network.nccl_log import (
    crossed_tier,
    fitted_efficiency,
    measured_busbw,
)
from clustersim.topologies.profile import profile_for_gpu

# Outputs in nccl-tests 2.x's layout (a root column) and 1.x's (none), their figures illustrative,
# not a measurement: the header says where busbw is
LOGS = Path(__file__).parents[1] / "data" / "nccl-logs"
CURRENT = (LOGS / "all_reduce_perf-2x.log").read_text()
OLDER = (LOGS / "all_reduce_perf-1x.log").read_text()


def test_reads_each_sizes_out_of_place_bus_bandwidth_where_the_header_puts_it():
    assert measured_busbw(CURRENT) == {1048576: 20.38, 4294967296: 150.15}
    assert measured_busbw(OLDER) == {536870912: 40.95}


def test_a_log_without_result_rows_is_an_error_naming_where_it_came_from():
    with pytest.raises(ScenarioError, match="--measured"):
        measured_busbw("# nThread 1 nGpus 8\n# Out of bounds values : 0 OK\n")


@pytest.mark.parametrize("op", ["allreduce", "alltoall", "allgather"])
@pytest.mark.parametrize("gpus, tier, truth", [(32, "inter_node", 0.4), (8, "intra_node", 0.6)])
def test_a_log_made_at_a_fraction_gives_that_fraction_back(op, gpus, tier, truth):
    profile = profile_for_gpu("a100-80gb")
    cluster = build_cluster({"preset": "dgx-a100-80gb", "gpus": 32})
    assert crossed_tier(cluster, gpus) == tier
    link = getattr(cluster, tier).model_copy(update={"efficiency": truth})
    made = bus_bandwidth(cluster.model_copy(update={tier: link}), profile, op, gpus, 2**30,
                         "representative") / 1e9
    found = fitted_efficiency(cluster, profile, op, gpus, 2**30, made)
    assert found == pytest.approx(truth, rel=2e-3)


def test_no_fraction_is_found_above_the_whole_line_rate():
    cluster = build_cluster({"preset": "dgx-a100-80gb", "gpus": 32})
    line = bus_bandwidth(cluster, profile_for_gpu("a100-80gb"), "allreduce", 32, 2**30) / 1e9
    assert fitted_efficiency(cluster, profile_for_gpu("a100-80gb"), "allreduce", 32, 2**30,
                             2 * line / 0.91) is None


def test_a_zero_byte_row_carries_no_bandwidth():
    assert measured_busbw("#  size count type redop root time algbw busbw #wrong\n"
                          "0 0 float sum -1 0.1 0.00 0.00 0\n"
                          "1024 256 float sum -1 10.0 0.10 0.19 0\n") == {1024: 0.19}
