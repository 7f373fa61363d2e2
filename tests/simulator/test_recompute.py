"""What recomputation costs per layer, against the one published per-layer measurement of it.

Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: forward and backward time of one
transformer layer of their 22B GPT (hidden 6144, 64 heads, sequence 2048, micro-batch 4, tp 8 on
DGX A100, Megatron-LM without flash attention) under five settings, in ms. Selective
recomputation re-runs the attention core, "QK^T, softmax, softmax dropout, and attention over
V" (sec. 5). The A100 profile was fitted on other runs (Narayanan et al. 2021, Table 1), so
this table is held out. Exposed tensor-parallel communication is part of the published times.
"""

from __future__ import annotations

import pytest

import clustersim
from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import CostModel, kernel_times
from clustersim.simulator.costs.layer_comm import tensor_comm
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model.activations import scenario_layer_bytes
from clustersim.simulator.model.workload import recompute_flops_per_step

# (sequence parallel, recompute): (forward ms, backward ms)
TABLE_4 = {
    (False, "none"): (7.7, 11.9),
    (True, "none"): (7.2, 11.8),
    (False, "full"): (7.7, 19.5),
    (False, "selective"): (7.7, 13.2),
    (True, "selective"): (7.2, 13.1),
}


def layer_ms(sequence_parallel: bool, recompute: str) -> tuple[float, float]:
    """One layer's (forward, backward) with its exposed TP collectives, in ms."""
    s = build_scenario({
        "model": {"layers": 48, "hidden": 6144, "heads": 64, "ffn_hidden": 24576,
                  "vocab": 51200, "seq_len": 2048, "ffn_kind": "gelu"},
        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
        "training": {"global_batch": 4, "micro_batch": 4, "precision": "bf16",
                     "flash_attention": False},
        "parallel": {"tp": 8, "sequence_parallel": sequence_parallel, "recompute": recompute}})
    cm = CostModel(s)
    forward, backward, _ = cm.per_layer
    tp_forward, tp_backward = tensor_comm(cm, kernel_times(cm)[0])
    return 1e3 * (forward + tp_forward), 1e3 * (backward + tp_backward)


@pytest.mark.parametrize(("sp", "recompute"), list(TABLE_4))
def test_a_layer_takes_the_published_time(sp, recompute):
    """Backward within 7%, forward within 10%: the forward comes out 7-10% slow, the backward
    3-6%. The A100's sustained fraction, fitted on Narayanan et al.'s end-to-end runs of 2021,
    stands for everything the model misses in a step and falls on the kernels alone, so a
    layer timed alone is slower than measured, and Korthikanti et al.'s software of 2022 is
    faster than Narayanan et al.'s (their 1T run, the same split, 177 against 163 TFLOP/s per
    GPU). Fitted for a zero median error of the engine's predictions (2026-11-26, 0.803 ->
    0.784) it left these layers 2% slower than the mean's fit did; fitted on the settings
    Narayanan et al.'s scripts ran (2026-11-27, micro-batches of up to 16 where the table had
    1: 0.784 -> 0.777) another 1%. With element-wise backward charged at twice the forward's
    bytes (before 2026-11-26) the backward was 6-8% slow."""
    forward, backward = layer_ms(sp, recompute)
    published = TABLE_4[sp, recompute]
    assert forward == pytest.approx(published[0], rel=0.10)
    assert backward == pytest.approx(published[1], rel=0.07)


def test_recomputation_overheads_are_the_published_ones():
    """Table 4's overheads over the layer without recomputation: full 39%, selective 7%,
    selective with sequence parallelism 4% (over sequence parallelism alone)."""
    def total(sp, recompute):
        return sum(layer_ms(sp, recompute))

    assert total(False, "full") / total(False, "none") - 1 == pytest.approx(0.39, abs=0.03)
    assert total(False, "selective") / total(False, "none") - 1 == pytest.approx(0.07, abs=0.03)
    assert total(True, "selective") / total(True, "none") - 1 == pytest.approx(0.04, abs=0.03)


def test_selective_recomputation_reruns_a_fused_attention_forward():
    """Megatron-Core checkpoints the core attention whatever kernel runs it
    (megatron/core/transformer/attention.py: ``if self.checkpoint_core_attention and
    self.training``), so with flash attention selective recomputation adds the fused kernel's
    forward to every layer's backward, in the compute and in what TP can hide behind, and
    keeps the same activations as none (the kernel stores no scores)."""
    def model(recompute: str) -> CostModel:
        return CostModel(build_scenario({
            "model": {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 8192,
                      "vocab": 32000},
            "cluster": {"preset": "dgx-h100", "gpus": 8},
            "training": {"global_batch": 8, "micro_batch": 1},
            "parallel": {"tp": 8, "sequence_parallel": True, "recompute": recompute}}))
    none, selective = model("none"), model("selective")
    attention_forward = none.passes[0].attention
    assert attention_forward > 0
    assert selective.per_layer[1] - none.per_layer[1] == pytest.approx(attention_forward)
    assert (kernel_times(selective)[1][1] - kernel_times(none)[1][1]
            == pytest.approx(attention_forward))
    assert selective.per_layer[0] == none.per_layer[0]


# --- torchtitan's op-level selective checkpointing (recompute_modules: [op_sac]) ------------------
#
# torchtitan/distributed/activation_checkpoint.py saves the outputs of every matmul but each
# second one in forward order and of the fused attention kernel, and re-runs the rest. Its
# documented runs (docs/performance.md @ 0413364, FSDP2 on 64 A100 80GB) are the oracle for the
# cost; the counts below are the policy applied by hand to a Llama block (wq wk wv, wo, w1 w3 w2).

def torchtitan_run(preset: str, micro_batch: int, recompute: str, **parallel):
    return {"model": {"preset": preset},
            "cluster": {"preset": "dgx-a100-80gb", "gpus": 64},
            "training": {"framework": "fsdp", "global_batch": 64 * micro_batch,
                         "micro_batch": micro_batch, "flash_attention": True},
            "parallel": {"tp": 1, "pp": 1, "recompute": recompute, **parallel}}


def test_op_sac_reruns_every_second_matmul_of_a_llama_block():
    """``wk``, ``wo`` and ``w3``: 2 s h (kv + h + f) FLOPs per layer and sequence."""
    s = build_scenario(torchtitan_run("llama3-8b", 1, "selective"))
    assert s.parallel.recomputed == {"op_sac"}
    h, kv, f, seq = 4096, 8 * 128, 14336, 8192
    by_hand = 32 * 64 * 2 * seq * h * (kv + h + f)
    assert recompute_flops_per_step(s) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2])
def test_op_sac_keeps_the_block_input_and_its_save_list(tp):
    """Per layer and micro-batch: the block's input, the query and value, the attention
    kernel's output and fp32 log-sum-exp, ``w1``'s and ``w2``'s outputs (``w2``'s the row-parallel
    ``T x h`` partial sum) and, under tensor parallelism with sequence parallelism, the two
    reduce-scatters' outputs."""
    s = build_scenario(torchtitan_run("llama3-8b", 1, "selective", tp=tp,
                                      sequence_parallel=tp > 1))
    T, h, kv, f, heads = 8192, 4096, 8 * 128, 14336, 32
    by_hand = 2 * T * (h / tp + h / tp + kv / tp + h / tp + f / tp + h) + 4 * heads / tp * T
    if tp > 1:
        by_hand += 2 * 2 * T * h / tp
    assert scenario_layer_bytes(s, "selective") == pytest.approx(by_hand, rel=1e-12)


def test_op_sac_costs_what_torchtitan_measured():
    """Llama 2 13B, local batch 2: 2,162 tokens/s per GPU without checkpointing and 1,904 with
    'selective op', 13.6% more time per token; clustersim within 2 points of it."""
    none = clustersim.simulate(torchtitan_run("llama2-13b", 2, "none"))
    op = clustersim.simulate(torchtitan_run("llama2-13b", 2, "selective"))
    assert op.step_time_s / none.step_time_s - 1 == pytest.approx(2162 / 1904 - 1, abs=0.02)


@pytest.mark.parametrize(("micro_batch", "ran"), [(1, True), (2, False)])
def test_op_sac_fits_llama2_70b_where_torchtitan_did(micro_batch, ran):
    """torchtitan trained Llama 2 70B with 'selective op' at local batch 1 and ran out of
    memory at 2 (its footnote 1). Megatron's selective recomputation, which re-runs only the
    attention core, keeps too much for either."""
    op = clustersim.simulate(torchtitan_run("llama2-70b", micro_batch, "selective"))
    core = clustersim.simulate(torchtitan_run("llama2-70b", micro_batch, "selective",
                                              recompute_modules=["core_attn"]))
    assert op.to_dict()["memory"]["fits"] is ran
    assert not core.to_dict()["memory"]["fits"]


@pytest.mark.parametrize(("change", "words"), [
    ({"parallel": {"recompute_modules": ["op_sac", "core_attn"]}}, "alone"),
    ({"training": {"flash_attention": False}}, "flash_attention"),
    ({"model": {"preset": "mixtral-8x7b"}}, "dense"),
])
def test_op_sac_refuses_what_it_does_not_cost(change, words):
    raw = torchtitan_run("llama3-8b", 1, "selective")
    for section, fields in change.items():
        raw[section] = {**raw[section], **fields}
    with pytest.raises(ScenarioError, match=words) as caught:
        build_scenario(raw)
    assert caught.value.field == "parallel.recompute_modules"
