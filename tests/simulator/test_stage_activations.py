"""What a pipeline stage holds at its peak, against the schedules and published closed forms.

In-flight micro-batches: Narayanan et al. 2021 and Megatron-LM's pipeline schedules. The layers'
activations: Korthikanti et al. 2022, sec. 4.2-4.3; the output layer and what the loss keeps
and allocates (``activations.head_bytes``, ``loss_backward_bytes``); recomputation one layer at
a time. Split from test_memory.py (model states and one layer's activations).
"""

from __future__ import annotations

from collections import Counter

import pytest
from memory_helpers import gpt, scenario

from clustersim.simulator.costs import memory as mem
from clustersim.simulator.pipeline.schedules import Kind, build_schedule

# --- 3. micro-batches in flight -------------------------------------------------------------------

def pipeline(pp, m, schedule="1f1b", v=1, layers=None, training=None, **kw):
    """pp stages on pp GPUs (tp = dp = 1), so the global batch is the micro-batch count m."""
    return scenario(gpt(layers=layers or 2 * pp * v), gpus=pp, global_batch=m,
                    training={"flash_attention": False, **(training or {})},
                    pp=pp, schedule=schedule, virtual_stages=v, **kw)


@pytest.mark.parametrize("pp, m", [(2, 1), (4, 4), (4, 8), (8, 3)])
def test_gpipe_holds_every_microbatch_on_every_stage(pp, m):
    """GPipe runs all m forwards before any backward."""
    s = pipeline(pp, m, "gpipe")
    assert [mem.inflight_microbatches(s, i) for i in range(pp)] == [[m]] * pp


@pytest.mark.parametrize("pp, m", [(2, 1), (4, 2), (4, 4), (4, 16), (8, 5)])
def test_1f1b_holds_p_minus_stage_microbatches(pp, m):
    """Narayanan et al. 2021 sec. 2.2.1: stage i holds min(p - i, m); stage 0 holds p."""
    s = pipeline(pp, m)
    assert [mem.inflight_microbatches(s, i) for i in range(pp)] == [
        [min(pp - i, m)] for i in range(pp)]


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (4, 2, 8), (4, 4, 8), (4, 2, 64), (8, 2, 16),
                                      (2, 3, 2 * 3), (4, 3, 4)])
def test_interleaved_holds_megatron_warmup_plus_one(pp, v, m):
    """Megatron-LM: 2(p - i - 1) + (v - 1)p warm-up forwards, plus the first steady one, capped at
    m v; when m == p every forward runs first, so every stage holds m v."""
    s = pipeline(pp, m, "interleaved", v)
    for i in range(pp):
        expected = m * v if m == pp else min(2 * (pp - i - 1) + (v - 1) * pp + 1, m * v)
        assert sum(mem.inflight_microbatches(s, i)) == expected


def test_interleaved_spreads_microbatches_over_chunks_in_groups_of_p():
    """p = 4, v = 2, m = 8: forwards 0-3 run chunk 0, 4-7 chunk 1, 8- chunk 0 again, so stage 0's
    11 split 7 + 4, stage 1's 9 split 5 + 4, stage 2's 7 split 4 + 3, stage 3's 5 split 4 + 1."""
    s = pipeline(4, 8, "interleaved", 2)
    assert [mem.inflight_microbatches(s, i) for i in range(4)] == [[7, 4], [5, 4], [4, 3], [4, 1]]


def test_interleaved_with_as_many_microbatches_as_stages_holds_them_all():
    """Megatron-LM's ``all_warmup_microbatches``: m == p runs all m v forwards first."""
    s = pipeline(4, 4, "interleaved", 2)
    assert [mem.inflight_microbatches(s, i) for i in range(4)] == [[4, 4]] * 4


def peak_per_chunk(actions, pp: int, v: int) -> list[int]:
    """Forwards minus backwards per local chunk, the first time their total is highest."""
    held: Counter[int] = Counter()
    best, best_total = [0] * v, -1
    for action in actions:
        held[action.chunk // pp] += 1 if action.kind is Kind.FORWARD else -1
        if sum(held.values()) > best_total:
            best_total, best = sum(held.values()), [held[c] for c in range(v)]
    return best


@pytest.mark.parametrize("name, pp, v, m", [("gpipe", 4, 1, 6), ("1f1b", 4, 1, 2),
                                             ("1f1b", 4, 1, 9), ("interleaved", 4, 2, 8),
                                             ("interleaved", 4, 4, 12), ("interleaved", 2, 3, 6),
                                             ("interleaved", 8, 2, 16), ("interleaved", 4, 2, 4)])
def test_inflight_counts_agree_with_the_schedule_action_lists(name, pp, v, m):
    """Replaying each rank's action list, the most chunk-micro-batches alive at once (and how they
    split over the chunks) is what ``inflight_microbatches`` says, m == p included."""
    s = pipeline(pp, m, name, v)
    schedule = build_schedule(name, pp, m, v)
    for i in range(pp):
        assert mem.inflight_microbatches(s, i) == peak_per_chunk(schedule[i], pp, v)


def korthikanti_layer(s) -> float:
    """sbh(34 + 5as/h) for the scenario's GPT layer (no TP, no flash attention)."""
    m, b = s.model, s.training.micro_batch
    return m.seq_len * b * m.hidden * (34 + 5 * m.heads * m.seq_len / m.hidden)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_1f1b_first_stage_holds_the_whole_models_layer_activations(pp):
    """Korthikanti sec. 4.2.3: p micro-batches of L/p layers, i.e. L layers' worth whatever p,
    plus the embedding dropout mask (sbh, 1 byte) of each of the p micro-batches."""
    s = pipeline(pp, 4 * pp)
    m = s.model
    embedding_masks = pp * m.seq_len * m.hidden
    assert mem.stage_activation_bytes(s, 0) == pytest.approx(
        m.layers * korthikanti_layer(s) + embedding_masks, rel=1e-12)


@pytest.mark.parametrize("pp, v, m, chunk0", [(2, 2, 4, 3), (4, 2, 8, 7), (4, 4, 8, 7),
                                              (8, 2, 16, 15)])
def test_interleaved_first_stage_holds_l_times_1_plus_p_minus_1_over_pv(pp, v, m, chunk0):
    """Korthikanti sec. 4.2.3: L (1 + (p-1)/(pv)) layers' activations on the first stage with
    layers split evenly; plus one embedding mask (sbh) per micro-batch in flight on chunk 0
    (``chunk0``: forwards k < 2(p-1) + (v-1)p + 1 with (k // p) % v == 0, counted by hand)."""
    s = pipeline(pp, m, "interleaved", v)
    big_l = s.model.layers
    embedding_masks = chunk0 * s.model.seq_len * s.model.hidden
    layers = mem.stage_activation_bytes(s, 0) - embedding_masks
    assert layers == pytest.approx(big_l * (1 + (pp - 1) / (pp * v)) * korthikanti_layer(s),
                                   rel=1e-12)


def output_layer(s) -> float:
    """Korthikanti sec. 4.3 without SP or TP: 4sbh (final norm and output-layer inputs) + 4sbv
    (fp32 logits for the cross-entropy), per micro-batch."""
    m = s.model
    return 4 * m.seq_len * m.hidden + 4 * m.seq_len * m.vocab


def loss_gradient(s, bytes_per_logit: int = 2) -> float:
    """What the loss's backward allocates per micro-batch beside the kept logits: Megatron-LM's
    in-place cross-entropy only the bf16 cast of its fp32 gradient (2sbv)."""
    m = s.model
    return bytes_per_logit * m.seq_len * s.training.micro_batch * m.vocab


@pytest.mark.parametrize("name, held", [("1f1b", 1), ("gpipe", 6)])
def test_last_stage_keeps_logits_for_every_microbatch_in_flight(name, held):
    """The last stage holds L/p layers and one output layer per micro-batch in flight: 1 under
    1F1B, all m = 6 under GPipe; and, once, what the first backward's loss allocates."""
    s = pipeline(4, 6, name)
    per_microbatch = s.model.layers / 4 * korthikanti_layer(s) + output_layer(s)
    assert mem.stage_activation_bytes(s, 3) == pytest.approx(
        held * per_microbatch + loss_gradient(s), rel=1e-12)


@pytest.mark.parametrize("kernel, kept, gradients", [
    ("vocab_parallel", 4, 2),  # fp32 softmax kept, gradient in place, cast back to bf16
    ("pytorch", 4, 8),  # log_softmax's fp32 output kept; nll and log_softmax fp32 gradients
    ("fused", 2, 2),  # flash-attn's kernel keeps its bf16 input and writes one bf16 gradient
])
def test_the_loss_kernel_decides_what_the_logits_cost(kernel, kept, gradients):
    """Per logit (s b v on one rank), the bytes each cross-entropy keeps until backward and the
    bytes its backward allocates beside them, on a one-stage model whose logits dwarf a
    layer's recomputation."""
    s = pipeline(1, 2, training={"loss_kernel": kernel}, layers=2)
    m = s.model
    sbh = m.seq_len * m.hidden
    layers = m.layers * korthikanti_layer(s) + sbh  # and the embedding's dropout mask
    expected = layers + 4 * sbh + kept * m.seq_len * m.vocab + loss_gradient(s, gradients)
    assert mem.stage_activation_bytes(s, 0) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("framework, kernel", [
    ("megatron", "vocab_parallel"), ("deepspeed", "vocab_parallel"), ("fsdp", "pytorch")])
def test_each_stack_runs_its_own_cross_entropy(framework, kernel):
    """Megatron-LM and Megatron-DeepSpeed call the vocab-parallel cross-entropy, torchtitan
    PyTorch's on fp32 logits (docs/frameworks.md)."""
    s = pipeline(1, 2, training={"framework": framework})
    assert s.training.loss_kernel == kernel


@pytest.mark.parametrize("recompute, kept, transient", [
    ("full", 2, 32),  # keeps the 2sbh input; backward rebuilds the other 32sbh + 5as^2b
    ("selective", 34, 0),  # keeps 34sbh; backward rebuilds 5as^2b
])
def test_recompute_keeps_less_and_rebuilds_one_layer_at_a_time(recompute, kept, transient):
    """One stage, one micro-batch: L layers at their recompute size, plus what backward rebuilds
    for one layer, plus the embedding mask (sbh) and the output layer."""
    s = pipeline(1, 2, recompute=recompute)
    m = s.model
    sbh = m.seq_len * m.hidden
    scores = 5 * m.heads * m.seq_len**2
    expected = m.layers * kept * sbh + transient * sbh + scores + sbh + output_layer(s)
    assert mem.stage_activation_bytes(s, 0) == pytest.approx(expected, rel=1e-12)
