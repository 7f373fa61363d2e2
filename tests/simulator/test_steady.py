"""The steady-state shortcut: a step of many micro-batches, extended from three short ones,
equals simulating every micro-batch, or is not taken."""

from __future__ import annotations

import json

import pytest
from steady_helpers import assert_same, full_and_shortcut, llama

from clustersim.simulator.discrete_event import steady
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.topologies.profile import profile_for_gpu

CASES = {
    "1f1b ZeRO-1 overlapped, sp": llama(48, sequence_parallel=True, zero=1),
    "1f1b ZeRO-0, reduction after the step": llama(48, zero=0, overlap_grad_reduce=False),
    "1f1b ZeRO-2, reduce-scatter per micro-batch": llama(48, zero=2),
    "1f1b ZeRO-3 with prefetch": llama(48, zero=3, dp=4, pp=2),
    "1f1b no param-gather overlap": llama(48, zero=1, overlap_param_gather=False),
    "gpipe": llama(24, schedule="gpipe"),
    "interleaved, tp_comm_overlap": llama(96, schedule="interleaved", virtual_stages=2,
                                          sequence_parallel=True, tp_comm_overlap=True),
    "zb-h1, split backwards": llama(48, schedule="zb-h1", zero=1),
    "zb-h1, ZeRO-2": llama(48, schedule="zb-h1", zero=2),
    "MoE with expert parallelism": llama(48, ep=2, sequence_parallel=True,
                                         model={"experts": 4, "top_k": 2}),
    "across nodes, full recompute": llama(48, tp=8, dp=2, recompute="full"),
}


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_the_extended_step_equals_simulating_every_microbatch(raw):
    assert_same(*full_and_shortcut(raw))


def test_compute_slowed_by_nccl_kernels_is_extended_exactly():
    """The fluid model re-rates compute when a collective starts or ends: still periodic."""
    profile = profile_for_gpu("h100-sxm").model_copy(update={"comm_compute_slowdown": 0.2})
    assert_same(*full_and_shortcut(CASES["1f1b ZeRO-2, reduce-scatter per micro-batch"],
                                   profile=profile))


def test_full_fidelity_is_extended_exactly():
    """Every rank of every DP replica, flows sharing the fabric."""
    assert_same(*full_and_shortcut(llama(32, dp=4), "full"))


def test_gpipe_memory_grows_with_the_microbatches_and_is_extended_exactly():
    """GPipe holds all m micro-batches: the peak is affine in m, not constant."""
    whole, fast = full_and_shortcut(CASES["gpipe"])
    s = build_scenario(CASES["gpipe"])
    fewer = Engine(s, microbatches=12).run()
    assert whole.per_stage[0].activations == pytest.approx(2 * fewer.per_stage[0].activations)
    assert_same(whole, fast)


def test_numbers_off_a_line_are_not_extended():
    """A quantity quadratic in the micro-batch count fails the check: simulate everything."""
    s = build_scenario(CASES["gpipe"])
    quadratic = lambda m: [steady.Totals(m * m, m, 0, 0, 0, m)]  # noqa: E731
    affine = lambda m: [steady.Totals(3 * m + 1, m, 0, 2 * m + 1, 0, 5)]  # noqa: E731
    assert steady.extrapolated(s, quadratic) is None
    m = s.microbatches
    assert steady.extrapolated(s, affine) == [steady.Totals(3 * m + 1, m, 0, 2 * m + 1, 0, 5)]


def test_few_microbatches_or_an_unknown_schedule_are_simulated_whole():
    assert steady.sample_counts(build_scenario(llama(8))) is None  # 4+5+6 > 8 / 2
    assert steady.sample_counts(build_scenario(llama(48))) == (4, 5, 6)
    assert steady.sample_counts(build_scenario(
        llama(96, schedule="interleaved", virtual_stages=2))) == (8, 12, 16)


def test_a_trace_still_holds_every_span(tmp_path):
    """With a trace the step is simulated whole: m forwards and m backwards on every stage."""
    s = build_scenario(llama(48, dp=1))
    path = tmp_path / "trace.json"
    traced = simulate(s, trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    for rank in range(4):
        names = {e["name"] for e in events
                 if e["ph"] == "X" and e["pid"] == rank * 2 and e["cat"] == "compute"}
        for way in "FB":
            assert len({n for n in names if n.startswith(way)}) == 48
    assert traced.step_time_s == pytest.approx(simulate(s).step_time_s, rel=1e-9)
