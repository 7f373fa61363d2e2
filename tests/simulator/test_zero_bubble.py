"""ZB-H1: the backward split into input- and weight-gradient halves (Qi et al. 2024), its order,
bubble and memory against the paper's closed forms, PyTorch's own order, and the engine."""

from __future__ import annotations

from collections import Counter

import pytest
import schedule_oracle as oracle
from sim_helpers import FREE, flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import CostModel, estimate
from clustersim.simulator.costs import compute, split_backward
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs.work import chunk_work
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.schedules import (
    Action,
    Kind,
    build_schedule,
    format_schedule,
    one_f_one_b,
    with_communication,
    zero_bubble_h1,
)
from clustersim.topologies import network as net

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def execute(schedule, pp: int, times: dict[Kind, float]) -> tuple[float, dict[int, int]]:
    """The list-scheduling oracle (``schedule_oracle.py``), one chunk per rank."""
    return oracle.execute(schedule, pp, times)


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_each_rank_runs_every_microbatch_forward_input_and_weight_once(pp, m):
    for r, actions in zero_bubble_h1(pp, m).items():
        assert Counter(actions) == Counter(
            [Action(r, k, i) for k in (F, I, W) for i in range(m)])
        for i in range(m):  # a weight-gradient half after its input half
            assert actions.index(Action(r, W, i)) > actions.index(Action(r, I, i))


def test_golden_order_matches_pytorchs_zero_bubble():
    """PyTorch builds ScheduleInterleavedZeroBubble's ranks with ``_get_1f1b_rank_ops``; with
    one chunk per rank (ZB1P = ZB-H1) its order is ours, no-ops aside."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    pp, m = 4, 8
    ours = format_schedule(zero_bubble_h1(pp, m)).splitlines()
    for r in range(pp):
        warmup = min(pp - 1 - r, m)
        ops = schedules._get_1f1b_rank_ops(1, pp, warmup, m - warmup, warmup, r,
                                           lambda step, r=r: r, lambda step, r=r: r, r,
                                           enable_zero_bubble=True)
        assert ",".join(str(a) for a in ops if a is not None) == ours[r]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m", [8, 16, 32])
def test_bubble_is_p_minus_1_times_f_plus_b_minus_w(pp, m):
    """Equal stages, free sends: ZB-H1 idles (p - 1)(T_F + T_B - T_W) (Qi et al. 2024,
    sec. 3.1, B the input-gradient half), where 1F1B idles (p - 1)(T_F + T_B + T_W)."""
    times = {F: 1.0, I: 1.0, W: 1.0, B: 2.0}
    ideal = m * 3.0
    zb, _ = execute(zero_bubble_h1(pp, m), pp, times)
    one, _ = execute(one_f_one_b(pp, m), pp, times)
    assert zb - ideal == pytest.approx((pp - 1) * (1.0 + 1.0 - 1.0))
    assert one - ideal == pytest.approx((pp - 1) * 3.0)
    assert (zb - ideal) / (one - ideal) == pytest.approx(1 / 3)


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 8), (4, 2), (8, 16)])
def test_every_stage_holds_the_first_stage_peak_of_1f1b(pp, m):
    """Activations freed by W: min(p, m) on every rank, 1F1B's worst (its first) stage."""
    times = {F: 1.0, I: 1.0, W: 1.0, B: 2.0}
    _, zb = execute(zero_bubble_h1(pp, m), pp, times)
    _, one = execute(one_f_one_b(pp, m), pp, times)
    assert all(zb[r] == min(pp, m) for r in range(pp))
    assert max(zb.values()) == max(one.values())


def test_input_halves_send_and_receive_weight_halves_do_not():
    lowered = with_communication(build_schedule("zb-h1", 2, 2), chunks=2)
    assert format_schedule(lowered).splitlines() == [
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1",
        "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1",
    ]


def zb_scenario(schedule: str, **kw):
    return scenario(layers=16, micro_batches=16, pp=4, schedule=schedule, **kw)


def test_the_engine_splits_the_backward_by_its_weight_gradient_gemms():
    """The engine's ZB-H1 step on free links is the paper's closed form with the halves the
    cost model gives: m(T_F + T_B) + (p - 1)(T_F + T_I - T_W) on the slowest stage."""
    s = zb_scenario("zb-h1")
    engine = Engine(s, profile=flat_profile())
    step = engine.run().step_time_s
    work = chunk_work(engine.cm)
    middle = work[1]  # middle stages: no embedding, no output layer
    t_b, t_w = middle.backward, middle.whole.weight_grad
    assert 0.3 < t_w / t_b < 0.6  # dW is one of the backward's two GEMMs per weight
    slowest = max(w.forward + w.backward for w in work)
    bubble_terms = sum(w.forward + w.backward - 2 * w.whole.weight_grad for w in work)
    bubble_terms -= max(w.forward + w.backward - 2 * w.whole.weight_grad for w in work)
    assert step == pytest.approx(16 * slowest + bubble_terms, rel=0.02)
    one = Engine(zb_scenario("1f1b"), profile=flat_profile()).run().step_time_s
    assert step < one - 2 * (t_b - t_w)  # the bubble shrank by more than T_W per stage


def test_engine_and_closed_form_agree_on_time_and_memory():
    s = zb_scenario("zb-h1")
    engine = Engine(s, profile=flat_profile()).run()
    closed = estimate(s, flat_profile())
    assert engine.step_time_s == pytest.approx(closed.step_time_s, rel=0.03)
    for sim, formula in zip(engine.per_stage, closed.per_stage, strict=True):
        assert sim.activations == pytest.approx(formula.activations, rel=1e-6)


def test_zero_bubble_needs_one_chunk_per_rank():
    with pytest.raises(ValueError, match="one chunk per rank"):
        zero_bubble_h1(4, 8, 2)


# --- what the split costs (simulator/costs/split_backward.py) -------------------------------------

def gpt_layer(tp: int, **parallel):
    """One pipeline of a GPT layer stack (gelu MLP of 4h, MHA), s = 256, h = 512."""
    return scenario(layers=16, micro_batches=16, pp=4, tp=tp, schedule="zb-h1",
                    sequence_parallel=tp > 1, **parallel)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_weight_half_keeps_its_gemms_inputs_and_output_gradients(tp):
    """Qi et al. 2024, Table 1: W needs 32 sbh bytes per layer (bf16). Counted by hand with
    tensor and sequence parallelism, X all-gathered as the weight-gradient GEMM reads it:
    QKV X sbh + dY 3sbh/t, proj X sbh/t + dY sbh, FC1 X sbh + dY 4sbh/t, FC2 X 4sbh/t + dY sbh,
    elements: sbh (4 + 12/t), twice that in bytes."""
    sbh = 256 * 512
    assert split_backward.layer_weight_half_bytes(gpt_layer(tp)) == pytest.approx(
        2 * sbh * (4 + 12 / tp))


def test_deferred_weight_halves_hold_their_operands_not_the_activations():
    """Rank r of ZB-H1 defers r weight halves: at its peak, after the input half of
    micro-batch r, it holds (p - r - 1) micro-batches' activations A and (r + 1) weight halves
    W. With tp 2 and sequence parallelism W (20 sbh a layer) outweighs A (17 sbh), so the
    middle ranks' peaks are L((p - r - 1)A + (r + 1)W) in the engine and the closed form, not
    1F1B's first-stage p A."""
    s = gpt_layer(2)
    layer_a = mem.scenario_layer_bytes(s, "none")
    layer_w = split_backward.layer_weight_half_bytes(s)
    assert layer_w > layer_a
    engine = Engine(s, profile=flat_profile()).run()
    closed = estimate(s, flat_profile())
    for r in (1, 2):  # the middle stages: four layers, no embedding, no output layer
        expected = 4 * ((4 - r - 1) * layer_a + (r + 1) * layer_w)
        assert engine.per_stage[r].activations == pytest.approx(expected, rel=1e-9)
        assert closed.per_stage[r].activations == pytest.approx(expected, rel=1e-9)


def split_tp(bandwidth: float, **parallel):
    """ZB-H1 with tp 2 and sequence parallelism (NVLink at ``bandwidth`` GB/s), each stage
    on its own node and free links between them, so that the pipeline's sends cost nothing."""
    return scenario(layers=16, micro_batches=16, pp=4, tp=2, schedule="zb-h1",
                    sequence_parallel=True, model={"hidden": 4096, "heads": 32, "seq_len": 2048},
                    cluster={"gpus_per_node": 2, "inter_node": FREE,
                             "intra_node": {"bandwidth": bandwidth, "latency": 5e-6}},
                    **parallel)


@pytest.mark.parametrize("bandwidth", [30, 60, 100, 300])
def test_the_split_step_grows_by_the_lost_cover_of_every_input_half(bandwidth, monkeypatch):
    """Megatron-LM's backward runs the column layers' re-all-gather (2 of s b h / t a layer)
    beside their data-gradient GEMMs D and their reduce-scatter (2) beside their
    weight-gradient GEMMs W. An input half keeps only the first cover:
    c = max(0, A - D) + R - max(0, A + R - (D + W)) more exposed per layer (A, R the
    all-gathers' and reduce-scatters' time; the flat profile slows no GEMM beside them).
    ZB-H1's closed form then grows by (m + p - 1) L c (each of the slowest stage's m input
    halves, and every other stage's T_F + T_I - T_W), and the engine runs exactly that step."""
    s = split_tp(bandwidth)
    cm = CostModel(s, flat_profile())
    x = wl.tp_collective_bytes(s)
    a, r = 2 * net.allgather_time(cm.tp, x), 2 * net.reduce_scatter_time(cm.tp, x)
    d, w = compute.column_backward_times(cm)
    c = max(0.0, a - d) + r - max(0.0, a + r - (d + w))
    charged = estimate(s, flat_profile()).step_time_s
    engine = Engine(s, profile=flat_profile()).run().step_time_s
    monkeypatch.setattr(CostModel, "split_cost", property(lambda self: 0.0))
    free = estimate(s, flat_profile()).step_time_s
    assert c > 0
    assert charged - free == pytest.approx((16 + 4 - 1) * 4 * c, rel=1e-6, abs=1e-12)
    assert engine == pytest.approx(charged, rel=1e-5)


def test_transformer_engine_refuses_a_split_backward_with_userbuffers():
    """Transformer Engine raises NotImplementedError for a deferred weight-gradient GEMM with
    userbuffers (its linear modules): a scenario asking for both names the field."""
    with pytest.raises(ScenarioError, match="parallel.tp_comm_overlap.*zb-h1 defers"):
        split_tp(100, tp_comm_overlap=True)
