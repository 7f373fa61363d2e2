"""DualPipe (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" sec. 3.2.1 and Table 2;
deepseek-ai/DualPipe): two copies of the model on the same ranks in opposite directions, its
order against the reference repository's, its bubble and memory against the published table,
and the engine."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import schedule_oracle as oracle
from sim_helpers import flat_profile, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form import analytic
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.discrete_event import dp_traffic
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.pipeline.dual_schedules import dualpipe
from clustersim.simulator.pipeline.schedules import (
    Kind,
    format_schedule,
    one_f_one_b,
    with_communication,
    zero_bubble_h1,
)
from clustersim.simulator.pipeline.stages import (
    chunk_layout,
    embedding_chunks,
    head_chunks,
    stage_layers,
)
from clustersim.simulator.pipeline.v_schedules import dualpipe_v

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
PAIR = Kind.OVERLAP_F_B


def test_dual_placement_holds_two_copies_running_opposite_ways():
    """Rank r holds stage r of the copy that runs down (chunk r) and stage pp - 1 - r of the
    copy that runs up (chunk pp + stage): both end ranks hold an embedding and a head."""
    layout = chunk_layout(4, 2, "dual")
    assert layout.stages == (0, 1, 2, 3, 3, 2, 1, 0) and layout.copies == 2
    assert [layout.part(c) for c in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    s = dual()
    assert [embedding_chunks(s, r) for r in range(4)] == [[0], [], [], [4]]
    assert [head_chunks(s, r) for r in range(4)] == [[7], [], [], [3]]


def test_nothing_passes_between_the_copies():
    """Chunk 3 ends the down copy and chunk 4 begins the up one, both on rank 3: no send or
    receive joins them; rank 3 receives the down copy's activations from rank 2."""
    lowered = with_communication(dualpipe(4, 8), 8, chunk_layout(4, 2, "dual").stages, copies=2)
    kinds = {(a.chunk, a.kind) for a in lowered[3]}
    assert (3, Kind.SEND_F) not in kinds and (4, Kind.RECV_F) not in kinds
    assert (3, Kind.RECV_F) in kinds and (4, Kind.SEND_F) in kinds
    assert (3, Kind.RECV_B) not in kinds and (4, Kind.RECV_B) in kinds


def deepseek_order(pp: int, m: int, rank: int) -> str:
    """A transcription of ``DualPipe.step`` (deepseek-ai/DualPipe dualpipe/dualpipe.py, steps
    1-8), recording each compute call: ``_forward_chunk`` F, ``_backward_chunk`` B (I with
    ``enable_zb``, its weight half queued in ``WeightGradStore``), ``_weight_chunk`` W of the
    oldest queued, ``_forward_backward_chunk`` a pair. Phase p of a rank in the second half
    is direction ``p ^ 1``; direction 0 (down) is chunk ``rank``, direction 1 (up) chunk
    ``2 pp - 1 - rank``; micro-batches counted per direction, as the repo's chunk ids."""
    half_ranks, half_rank, second = pp // 2, min(rank, pp - 1 - rank), rank >= pp // 2
    chunk = (rank, 2 * pp - 1 - rank)
    f, b, queue, out = [0, 0], [0, 0], [], []
    middle = rank in (pp // 2 - 1, pp // 2)

    def forward(phase):
        d = phase ^ second
        out.append(f"{chunk[d]}F{f[d]}")
        f[d] += 1

    def backward(phase, zb=False):
        d = phase ^ second
        out.append(f"{chunk[d]}{'I' if zb else 'B'}{b[d]}")
        if zb:
            queue.append(f"{chunk[d]}W{b[d]}")
        b[d] += 1

    def weight():
        out.append(queue.pop(0))

    def forward_backward(p0, p1):
        out.append("OVERLAP_F_B")
        forward(p0)
        backward(p1)

    for _ in range((half_ranks - half_rank - 1) * 2):  # step 1
        forward(0)
    for _ in range(half_rank + 1):  # step 2
        forward(0)
        forward(1)
    for _ in range(half_ranks - half_rank - 1):  # step 3
        backward(1, zb=True)
        weight()
        forward(1)
    for i in range(m // 2 - pp + half_rank + 1):  # step 4
        if i == 0 and middle:
            forward(0)
            backward(1)
        else:
            forward_backward(0, 1)
        forward_backward(1, 0)
    for _ in range(half_ranks - half_rank - 1):  # step 5
        backward(1)
        forward_backward(1, 0)
    zb = False
    for i in range(half_rank + 1):  # step 6
        if i == (half_rank + 1) // 2 and half_rank % 2 == 1:
            zb = True
        backward(1, zb)
        if i == (half_rank + 1) // 2 and half_rank % 2 == 0:
            zb = True
        backward(0, zb)
    for _ in range(half_ranks - half_rank - 1):  # step 7
        weight()
        backward(0, zb=True)
    for _ in range(half_rank + 1):  # step 8
        weight()
    assert not queue
    return ",".join(out)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (2, 6), (4, 8), (4, 14), (6, 12), (8, 16),
                                       (8, 20), (10, 26)])
def test_golden_order_matches_deepseeks_dualpipe(pp, m):
    ours = format_schedule(dualpipe(pp, m)).splitlines()
    assert ours == [deepseek_order(pp, m, r) for r in range(pp)]


def test_two_ranks_by_hand():
    """pp 2, m 4: both ranks are middle ranks, so the first pair of step 4 runs apart."""
    assert format_schedule(dualpipe(2, 4)).splitlines() == [
        "0F0,3F0,0F1,3B0,OVERLAP_F_B,3F1,0B0,3B1,0I1,0W1",
        "2F0,1F0,2F1,1B0,OVERLAP_F_B,1F1,2B0,1B1,2I1,2W1"]


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 10), (8, 16), (8, 22)])
def test_each_direction_runs_half_the_microbatches_once(pp, m):
    for r, actions in dualpipe(pp, m).items():
        for c in (r, 2 * pp - 1 - r):
            for i in range(m // 2):
                mine = [a.kind for a in actions if a.chunk == c and a.microbatch == i
                        and a.kind is not PAIR]
                assert mine in ([F, B], [F, I, W])
        assert {a.microbatch for a in actions if a.kind is not PAIR} == set(range(m // 2))


def idle_per_rank(schedule, chunks: int, copies: int, t: dict[Kind, float],
                  pair: float) -> list[float]:
    """Each rank's idle time in the step, as DeepSeek's schedule figure shows it (its white
    cells): the step's length minus the rank's own busy time. Ranks run their lists in order,
    sends are free; an overlapped pair is one task of ``pair`` seconds that starts when both
    its inputs are there and hands both results over at its end, as
    ``DualPipe._forward_backward_chunk`` does."""
    tasks = {}
    for r, acts in schedule.items():
        out, i = [], 0
        while i < len(acts):
            if acts[i].kind is PAIR:
                out.append((acts[i + 1:i + 3], pair))
                i += 3
            else:
                out.append(([acts[i]], t[acts[i].kind]))
                i += 1
        tasks[r] = out
    done, clock = {}, dict.fromkeys(tasks, 0.0)
    busy, at = dict.fromkeys(tasks, 0.0), dict.fromkeys(tasks, 0)
    moved = True
    while moved:
        moved = False
        for r, todo in tasks.items():
            while at[r] < len(todo):
                acts, seconds = todo[at[r]]
                needs = [oracle.dependency(a, chunks // copies) for a in acts]
                if any(n is not None and n not in done for n in needs):
                    break
                clock[r] = max([clock[r]] + [done[n] for n in needs if n is not None]) + seconds
                busy[r] += seconds
                for a in acts:
                    done[(a.chunk, oracle.produces(a.kind), a.microbatch)] = clock[r]
                at[r] += 1
                moved = True
    assert all(at[r] == len(tasks[r]) for r in tasks), "deadlock"
    step = max(clock.values())
    return [step - busy[r] for r in sorted(tasks)]


def published(pp_stages: int, f: float, b: float, w: float, fb: float) -> float:
    """DeepSeek-V3 Table 2 (and the DualPipe README): DualPipe's bubble
    ``(PP/2 - 1)(F&B + B - 3W)``, B a whole backward, W its weight half."""
    return (pp_stages / 2 - 1) * (fb + b - 3 * w)


@pytest.mark.parametrize("pp", [2, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 4, 10])
def test_every_rank_idles_the_published_bubble_in_the_figures_units(pp, extra):
    """DeepSeek's figure (8 ranks, 20 micro-batches) draws F as one cell, a whole backward B
    as two, its input half and W as one each, and a pair F&B as three; every device then has
    six white cells, ``(8/2 - 1)(3 + 2 - 3)``. So the bubble is counted per device over the
    whole step: the step's length minus the device's own work. In those units every rank
    idles exactly the published bubble, for any number of micro-batches."""
    t = {F: 1.0, B: 2.0, I: 1.0, W: 1.0}
    idle = idle_per_rank(dualpipe(pp, 2 * pp + extra), 2 * pp, 2, t, pair=3.0)
    assert idle == pytest.approx([published(pp, 1, 2, 1, 3)] * pp)


def test_the_published_bubble_is_the_busiest_ranks_while_w_fits_in_f():
    """Off the figure's units the formula still holds where its derivation does: the input
    half as long as the forward (I = F, the figure's B = F + W) and W no longer than F. The
    middle ranks, which overlap the most pairs, then idle exactly ``(PP/2 - 1)(F&B + B -
    3W)``; the end ranks less. With W longer than F the deferred weight halves no longer fit
    the gaps they fill, and the bubble is longer than the formula says."""
    rng = random.Random(14)
    for _ in range(20):
        f, w = rng.uniform(0.5, 1.5), rng.uniform(0.1, 1.0)
        if w > f:
            f, w = w, f
        b = f + w
        fb = rng.uniform(b, f + b)  # a pair takes at least its backward, at most both
        t = {F: f, B: b, I: f, W: w}
        for pp in (4, 6, 8):
            idle = idle_per_rank(dualpipe(pp, 2 * pp + 2), 2 * pp, 2, t, pair=fb)
            assert max(idle) == pytest.approx(published(pp, f, b, w, fb))
            assert idle[pp // 2] == pytest.approx(max(idle))
    f, w = 0.6, 1.2
    idle = idle_per_rank(dualpipe(8, 20), 16, 2, {F: f, B: f + w, I: f, W: w}, pair=2.5)
    assert max(idle) > published(8, f, f + w, w, 2.5) + 1.0


def test_dualpipev_idles_the_same_bubble_on_half_the_ranks():
    """DualPipe "cut in half": PP stages on PP/2 ranks, the same published bubble."""
    t = {F: 1.0, B: 2.0, I: 1.0, W: 1.0}
    for ranks in (2, 3, 4):
        idle = idle_per_rank(dualpipe_v(ranks, 2 * ranks + 3), 2 * ranks, 1, t, pair=3.0)
        assert idle == pytest.approx([published(2 * ranks, 1, 2, 1, 3)] * ranks)


def test_table_2_bubbles_on_the_same_number_of_stages():
    """Table 2's rows measured alike (per rank, step minus own work; free sends): 1F1B
    ``(PP-1)(F+B)``, ZB1P ``(PP-1)(F+B-2W)``, DualPipe ``(PP/2-1)(F&B+B-3W)``, F&B = F + B
    as in the figure. On 8 stages DualPipe's bubble is a quarter of ZB1P's."""
    pp, m = 8, 24
    one = idle_per_rank(one_f_one_b(pp, m), pp, 1, {F: 1.0, B: 2.0}, pair=0.0)
    zb1p = idle_per_rank(zero_bubble_h1(pp, m), pp, 1, {F: 1.0, I: 1.0, W: 1.0}, pair=0.0)
    dual = idle_per_rank(dualpipe(pp, m), 2 * pp, 2, {F: 1.0, B: 2.0, I: 1.0, W: 1.0}, 3.0)
    assert one == pytest.approx([(pp - 1) * 3] * pp)
    assert zb1p == pytest.approx([(pp - 1) * (3 - 2)] * pp)
    assert dual == pytest.approx([(pp / 2 - 1) * (3 + 2 - 3)] * pp)


def dual(**kw):
    base = {"layers": 16, "micro_batches": 16, "pp": 4}
    return scenario(**{**base, **kw}, schedule="dualpipe", virtual_stages=2)


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("extra", [0, 6])
def test_every_rank_holds_pp_plus_one_stages_of_activations(pp, extra):
    """Table 2: "Activation per device PP + 1" (micro-batches of one stage; 1F1B's first
    stage holds PP). The oracle walks the lists; the memory model reads the same; the engine
    measures it."""
    m = 2 * pp + extra
    _, peak = oracle.execute(dualpipe(pp, m), 2 * pp, {F: 1, B: 2, I: 1, W: 1}, copies=2)
    assert all(peak[r] == pp + 1 for r in range(pp))
    s = dual(layers=2 * pp, micro_batches=m, pp=pp)
    assert all(sum(mem.inflight_microbatches(s, r)) == pp + 1 for r in range(pp))


def test_engine_measures_the_held_activations_and_twice_1f1bs_parameters():
    """Table 2: "Parameter per device 2x": each rank holds a stage of each copy. The engine's
    measured peak is the model's, on the inner ranks ``pp + 1`` micro-batches of a stage's
    layers; 1F1B's holds ``pp - stage`` there."""
    profile = flat_profile()
    run = Engine(dual(), profile=profile).run()
    one = scenario(layers=16, micro_batches=16, pp=4)
    layer = mem.scenario_layer_bytes(one, "none")
    for r, st in enumerate(run.per_stage):
        assert st.activations == pytest.approx(mem.stage_activation_bytes(dual(), r), rel=1e-9)
    for r in (1, 2):  # 4 layers a stage, no embedding or head
        assert run.per_stage[r].activations == pytest.approx(5 * 4 * layer, rel=1e-9)
        assert mem.stage_activation_bytes(one, r) == pytest.approx((4 - r) * 4 * layer, rel=1e-9)
    for r in (1, 2):  # inner ranks: layers only
        assert (sum(mem.stage_params_per_rank(dual(), r))
                == pytest.approx(2 * sum(mem.stage_params_per_rank(one, r))))
    ends = [sum(mem.stage_params_per_rank(dual(), r)) for r in (0, 3)]
    assert ends[0] == ends[1] == pytest.approx(sum(mem.stage_params_per_rank(one, 0))
                                               + sum(mem.stage_params_per_rank(one, 3)))


def test_engine_and_list_scheduled_estimate_agree_and_beat_1f1b_and_zbh1():
    profile = flat_profile()
    engine = Engine(dual(), profile=profile).run()
    assert engine.step_time_s == pytest.approx(estimate(dual(), profile).step_time_s, rel=0.03)
    others = {name: Engine(scenario(layers=16, micro_batches=16, pp=4, schedule=name),
                           profile=profile).run() for name in ("1f1b", "zb-h1")}
    assert engine.breakdown.compute == pytest.approx(others["1f1b"].breakdown.compute, rel=0.01)
    assert engine.breakdown.bubble < others["zb-h1"].breakdown.bubble / 2
    assert engine.step_time_s < others["zb-h1"].step_time_s


def test_the_copies_gradients_are_complete_after_each_chunks_last_backward():
    """Each chunk runs m/2 backwards: its data-parallel reduction starts after the last."""
    engine = Engine(dual(dp=2), profile=flat_profile())
    assert engine.passes == Counter({c: 8 for c in range(8)})
    result = engine.run()
    assert result.breakdown.exposed_comm > 0


def test_dualpipe_needs_even_pp_and_microbatches():
    """DualPipe.step's asserts, each as the field to change."""
    with pytest.raises(ScenarioError, match="even pp") as bad:
        dual(layers=12, pp=3, micro_batches=12)
    assert bad.value.field == "parallel.pp"
    with pytest.raises(ScenarioError, match="at least 2 \\* pp = 8") as bad:
        dual(micro_batches=6)
    assert bad.value.field == "training.global_batch"
    with pytest.raises(ScenarioError, match="even number"):
        dual(micro_batches=9)
    with pytest.raises(ValueError, match="virtual_stages: 2"):
        scenario(layers=16, micro_batches=16, pp=4, schedule="dualpipe")


def test_stage_layers_are_per_stage_of_a_copy():
    """``stage_layers`` gives each of the pp stages of a copy; rank r holds stage r of one
    copy and stage pp - 1 - r of the other."""
    s = dual(stage_layers=[3, 5, 5, 3])
    assert stage_layers(s) == [6, 10, 10, 6]
    with pytest.raises(ScenarioError) as bad:
        dual(stage_layers=[2] * 8)
    assert bad.value.field == "parallel.stage_layers"
    with pytest.raises(ScenarioError) as bad:
        dual(layers=2, pp=4)
    assert bad.value.field == "parallel.pp"


def test_zero3_is_refused():
    with pytest.raises(ScenarioError) as bad:
        dual(dp=2, zero=3)
    assert bad.value.field == "parallel.zero"


def test_the_two_copies_swap_their_gradients_before_the_optimizer(monkeypatch):
    """Both copies step on the summed gradients: rank r swaps its gradients with rank
    pp - 1 - r, which holds the other copy of its two stages, after the data-parallel
    reduction. On 10 GB/s links with no latency that adds the stage's gradient bytes / 10 GB/s
    to the step (hand computation from the parameter count), in the engine and in the closed
    form alike."""
    slow = {"bandwidth": 10, "latency": 0.0}
    s = dual(cluster={"intra_node": slow, "inter_node": slow})
    assert [analytic.twin_stage(s, r) for r in range(4)] == [3, 2, 1, 0]
    assert analytic.twin_stage(scenario(layers=16, micro_batches=16, pp=4), 0) is None
    grads = [sum(mem.stage_params_per_rank(s, r)) * 4 for r in range(4)]  # fp32 gradients
    assert [analytic.copy_sum_bytes(s, r) for r in range(4)] == pytest.approx(grads)
    profile = flat_profile()
    swapped = Engine(s, profile=profile).run().step_time_s
    closed = estimate(s, profile).step_time_s
    monkeypatch.setattr(analytic, "twin_stage", lambda s, stage: None)
    monkeypatch.setattr(dp_traffic, "twin_stage", lambda s, stage: None)
    apart = Engine(s, profile=profile).run().step_time_s
    assert swapped - apart == pytest.approx(max(grads) / 10e9, rel=0.02)
    assert closed - estimate(s, profile).step_time_s == pytest.approx(max(grads) / 10e9,
                                                                        rel=0.02)
