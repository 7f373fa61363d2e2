"""Per-stage parameters and buffers against closed forms: where the embedding and output layer
sit (tied or not), uneven stage splits (Llama 3 405B's 126 layers on 16 stages), tensor-parallel
sharding of layers, K/V heads and experts, and the communication buffers of pipelining and
ZeRO (Megatron-LM's layouts)."""

from __future__ import annotations

from collections import Counter

import pytest
from memory_helpers import gpt, llama, model_states, scenario

from clustersim.simulator.costs import memory as mem
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model import param_counts as pc

# --- 1. embedding and output layer ---------------------------------------------------------------

def llama_layer_per_rank(h: int, f: int, heads: int, kv_heads: int, t: int) -> float:
    """Llama layer on one tp rank: Q and O 2h^2/t, K and V 2h*d*max(kv/t, 1) (one head at least),
    SwiGLU 3hf/t, two RMSNorms 2h."""
    d = h // heads
    return 2 * h * h / t + 2 * h * d * max(kv_heads / t, 1) + 3 * h * f / t + 2 * h


def gpt_layer_per_rank(h: int, t: int) -> float:
    """GPT layer on one tp rank: 12h^2/t weights, QKV and MLP-up biases (3h + 4h)/t, the two
    row-parallel biases (2h) and two LayerNorms (4h) replicated: 12h^2/t + 7h/t + 6h."""
    return 12 * h * h / t + 7 * h / t + 6 * h


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("pp", [2, 4])
def test_tied_gpt_embedding_first_output_copy_last(tp, pp):
    """First stage: Vh/t words + s h positions (replicated); last: final LayerNorm (2h) and a copy
    of the tied output layer, Vh/t; middle stages only their layers."""
    s = scenario(gpt(), gpus=tp * pp, tp=tp, pp=pp)
    h, v, sl = 256, 1000, 128
    layers = 8 // pp * gpt_layer_per_rank(h, tp)
    got = [sum(mem.stage_params_per_rank(s, i)) for i in range(pp)]
    expected = [layers] * pp
    expected[0] += v * h / tp + sl * h
    expected[-1] += 2 * h + v * h / tp
    assert got == pytest.approx(expected, rel=1e-12)


def test_tied_embedding_on_one_stage_is_stored_once():
    """pp = 1: the output layer is the embedding itself: L layers + Vh + s h + 2h."""
    s = scenario(gpt(), gpus=1)
    h = 256
    expected = 8 * gpt_layer_per_rank(h, 1) + 1000 * h + 128 * h + 2 * h
    assert sum(mem.stage_params_per_rank(s, 0)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_untied_output_layer_always_sits_on_the_last_stage(pp):
    """Llama shape: Vh/t on the first stage, final RMSNorm and output layer h + Vh/t on the last,
    whatever pp (with pp = 1 one stage holds both)."""
    tp, h, v, f = 2, 256, 1000, 1024
    s = scenario(llama(), gpus=tp * pp, tp=tp, pp=pp)
    layers = 8 // pp * llama_layer_per_rank(h, f, 8, 8, tp)
    expected = [layers] * pp
    expected[0] += v * h / tp
    expected[-1] += h + v * h / tp
    got = [sum(mem.stage_params_per_rank(s, i)) for i in range(pp)]
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model, copy", [(gpt(), True), (gpt(tie_embeddings=False), False),
                                         (llama(), False)])
@pytest.mark.parametrize("pp", [1, 2, 4, 8])
def test_stage_params_sum_to_the_model_plus_the_tied_copy(model, copy, pp):
    """With tp = 1 the stages together hold the whole model, plus Vh for the last stage's copy of
    a tied output layer when pp > 1."""
    s = scenario(model, gpus=pp, pp=pp)
    total = sum(sum(mem.stage_params_per_rank(s, i)) for i in range(pp))
    extra = 1000 * 256 if copy and pp > 1 else 0
    assert total == pc.total_params(s.model) + extra


# --- 2. uneven stages -----------------------------------------------------------------------------

def llama3_405b(**parallel):
    return scenario("llama3-405b", gpus=128, global_batch=16, tp=8, pp=16, **parallel)


def test_llama3_405b_on_16_stages_splits_126_layers_into_14_of_8_and_2_of_7():
    """126 = 16 x 8 - 2: an even split gives fourteen stages 8 layers and two stages 7."""
    s = llama3_405b()
    assert Counter(mem.stage_layers(s)) == Counter({8: 14, 7: 2})


@pytest.mark.parametrize("stage_layers", [None, [7] + [8] * 14 + [7], [5] + [8] * 14 + [9]])
def test_llama3_405b_stage_params_follow_the_stage_layer_counts(stage_layers):
    """Stage i holds n_i layers of 2h^2/t + 2hd + 3hf/t + 2h (8 kv heads on tp = 8: one each), plus
    the embedding Vh/t on the first and the final norm and output Vh/t + h on the last."""
    s = llama3_405b(stage_layers=stage_layers)
    h, f, v = 16384, 53248, 128256
    layer = llama_layer_per_rank(h, f, 128, 8, 8)
    counts = stage_layers or mem.stage_layers(s)
    assert sum(counts) == 126
    for i, n in enumerate(counts):
        expected = n * layer + (v * h / 8 if i == 0 else 0) + (v * h / 8 + h if i == 15 else 0)
        assert sum(mem.stage_params_per_rank(s, i)) == pytest.approx(expected, rel=1e-12)


def test_llama3_405b_as_meta_split_it_holds_the_embedding_and_the_head_alone():
    """Dubey et al. 2024, sec. 3.3.2: one layer fewer on the first and the last stage, so that
    "the first model chunk on the first stage has only the embedding, and the last model chunk
    on the last stage has only output projection and loss": 128 chunks of 16 stages x 8, one
    layer each but those two (Megatron-Core's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split). Stages 0 and 15 hold 7 layers and the tables."""
    s = llama3_405b(schedule="interleaved", virtual_stages=8, stage_layers=[0] + [1] * 126 + [0])
    assert mem.stage_layers(s) == [7] + [8] * 14 + [7]
    h, f, v = 16384, 53248, 128256
    layer = llama_layer_per_rank(h, f, 128, 8, 8)
    for i, n in enumerate(mem.stage_layers(s)):
        expected = n * layer + (v * h / 8 if i == 0 else 0) + (v * h / 8 + h if i == 15 else 0)
        assert sum(mem.stage_params_per_rank(s, i)) == pytest.approx(expected, rel=1e-12)


# --- 3. tensor-parallel sharding ------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpt_layer_params_per_tp_rank(tp):
    """Megatron-LM: matrices and column-parallel biases split by t, row-parallel biases and
    LayerNorms replicated: 12h^2/t + 7h/t + 6h."""
    m = ModelSpec(**gpt(hidden=1024, heads=16))
    assert sum(mem.layer_params_per_rank(m, tp, 1)) == pytest.approx(
        gpt_layer_per_rank(1024, tp), rel=1e-12)


@pytest.mark.parametrize("kv_heads, tp", [(8, 1), (8, 4), (8, 8), (4, 8), (2, 8), (1, 4)])
def test_kv_heads_split_by_tp_down_to_one_per_rank(kv_heads, tp):
    """K and V keep max(kv/t, 1) heads per rank: fewer kv heads than tp are replicated."""
    h, f, heads = 1024, 2816, 16
    m = ModelSpec(**llama(hidden=h, heads=heads, kv_heads=kv_heads, ffn_hidden=f))
    assert sum(mem.layer_params_per_rank(m, tp, 1)) == pytest.approx(
        llama_layer_per_rank(h, f, heads, kv_heads, tp), rel=1e-12)


def test_moe_layer_keeps_local_experts_with_replicated_down_biases():
    """E/ep experts of (2hf + f)/t + h each (the down-projection bias h is replicated), and the
    dense part: attention 4h^2/t + 3h/t + h, router hE, two LayerNorms 4h."""
    h, f, experts, ep, tp = 256, 1024, 8, 4, 2
    m = ModelSpec(**gpt(hidden=h, heads=8, ffn_hidden=f, experts=experts, top_k=2))
    dense, expert = mem.layer_params_per_rank(m, tp, ep)
    assert dense == pytest.approx(4 * h * h / tp + 3 * h / tp + h + h * experts + 4 * h)
    assert expert == pytest.approx(experts / ep * ((2 * h * f + f) / tp + h))


# --- 4. buffers ---------------------------------------------------------------------------------

def test_pipeline_buffers_are_four_bsh_over_t_tensors():
    """An activation and a gradient each way, b s h / t elements (Megatron's scatter-gather)."""
    s = scenario(gpt(), gpus=8, tp=2, pp=4, training={"micro_batch": 2}, global_batch=16)
    assert mem.stage_buffer_bytes(s, 1) == 4 * 2 * 128 * 256 / 2 * 2


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_all_gather_cp_holds_a_layers_whole_k_v_and_their_gradients(kv_heads):
    """Transformer Engine's all-gather CP gathers K and V of the whole sequence (2 s kv_heads
    d elements) for one layer at a time, and in backward their gradients beside them; the
    ring and the all-to-alls hold nothing of the kind."""
    model = gpt(kv_heads=kv_heads)  # 8 heads of 32, sequence 128
    ring = scenario(model, gpus=4, cp=4, cp_comm="p2p")
    gathered = scenario(model, gpus=4, cp=4, cp_comm="allgather")
    whole_kv = 2 * 128 * kv_heads * 32 * 2  # K and V, every token, bf16
    assert mem.stage_buffer_bytes(gathered, 0) - mem.stage_buffer_bytes(ring, 0) == 2 * whole_kv
    ulysses = scenario(model, gpus=4, cp=2, cp_comm="a2a")
    assert mem.stage_buffer_bytes(ulysses, 0) == mem.stage_buffer_bytes(
        scenario(model, gpus=4, cp=2, cp_comm="p2p"), 0)


def test_zero2_keeps_two_gradient_buckets_but_never_more_than_the_gradients():
    """Two buckets of 40M parameters in flight, in the gradient type (fp32 main gradients by
    default under bf16, 2 bytes with bf16 gradients); a small model's whole gradient."""
    big = scenario("llama2-7b", gpus=8, zero=2)
    assert mem.stage_buffer_bytes(big, 0) == 2 * 40_000_000 * 4
    big16 = scenario("llama2-7b", gpus=8, zero=2, training={"grad_dtype": "bf16"})
    assert mem.stage_buffer_bytes(big16, 0) == 2 * 40_000_000 * 2
    small = scenario(gpt(), gpus=8, zero=2)
    assert mem.stage_buffer_bytes(small, 0) == pc.total_params(small.model) * 4


DEEPSPEED = {"framework": "deepspeed", "precision": "bf16"}


@pytest.mark.parametrize("zero, overlap, buckets", [(1, False, 1), (2, False, 1), (2, True, 2)])
def test_deepspeeds_zero_optimizer_holds_whole_500m_element_buckets(zero, overlap, buckets):
    """DeepSpeedZeroOptimizer.setup_buckets (stage_1_and_2.py): ``reduce_bucket_size``
    elements (5e8 by default) in the model's 16-bit dtype, a second with ``overlap_comm``;
    allocated whole, so a small model holds all of it too."""
    for model in ("llama2-7b", gpt()):
        s = scenario(model, gpus=8, zero=zero, overlap_grad_reduce=overlap, training=DEEPSPEED)
        assert mem.stage_buffer_bytes(s, 0) == buckets * 500_000_000 * 2


def test_deepspeeds_zero3_holds_one_bucket_beside_its_gathered_layers():
    """DeepSpeedZeroOptimizer_Stage3 allocates one ``reduce_bucket_size`` bucket with the
    optimizer (stage3.py), whatever ``overlap_comm``: beside the running layer's weights and
    gradients (bf16 under DeepSpeed's ZeRO) and the prefetched layer's weights."""
    layer = llama_layer_per_rank(4096, 11008, 32, 32, 1)
    for overlap in (False, True):
        s = scenario("llama2-7b", gpus=8, zero=3, overlap_grad_reduce=overlap,
                     training=DEEPSPEED)
        assert mem.stage_buffer_bytes(s, 0) == pytest.approx(
            500_000_000 * 2 + layer * (2 + 2) + layer * 2, rel=1e-12)


@pytest.mark.parametrize("zero, parallel, training", [
    (0, {}, {}),                        # bf16 stage 0: the BF16_Optimizer
    (1, {}, {"grad_dtype": "fp32"}),    # stage 1, fp32 accumulation: the BF16_Optimizer too
    (1, {"pp": 2}, {}),                 # the pipeline engine reduces after the last backward
])
def test_deepspeed_holds_no_buckets_where_its_zero_optimizer_does_not_run_in_backward(
        zero, parallel, training):
    s = scenario("llama2-7b", gpus=8, zero=zero, global_batch=16, **parallel,
                 training={**DEEPSPEED, **training})
    pipeline = 4 * 1 * s.model.seq_len * s.model.hidden * 2 if s.parallel.pp > 1 else 0
    assert mem.stage_buffer_bytes(s, 0) == pipeline


def test_zero3_gathers_two_layers_and_one_layers_gradients():
    """Running layer and prefetched next layer (2-byte weights), plus the running one's
    unsharded gradients (4-byte fp32 main gradients) on a middle stage (no embedding)."""
    s = scenario("llama2-7b", gpus=8, zero=3, pp=4)
    layer = llama_layer_per_rank(4096, 11008, 32, 32, 1)
    assert mem.stage_buffer_bytes(s, 1) == pytest.approx(
        4 * 4096 * 4096 * 2 + 2 * layer * 2 + layer * 4, rel=1e-12)


def test_zero3_gathers_a_large_embedding_whole():
    """llama3-8b's embedding (128256 x 4096 = 525M) outweighs a layer (218M): the running unit is
    the embedding, so 2 x Vh + one layer, 2 bytes each (bf16 gradients)."""
    s = scenario("llama3-8b", gpus=8, zero=3, training={"grad_dtype": "bf16"})
    h = 4096
    layer = llama_layer_per_rank(h, 14336, 32, 8, 1)
    assert mem.stage_buffer_bytes(s, 0) == pytest.approx((2 * 128256 * h + layer) * 2, rel=1e-12)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_without_data_parallelism_needs_no_buffers(zero):
    """dp*cp = 1: nothing is sharded, so nothing is gathered or bucketed."""
    s = scenario(gpt(), gpus=1, zero=zero)
    assert mem.stage_buffer_bytes(s, 0) == 0
    assert model_states(s) == 18 * pc.total_params(s.model)  # 2 + 4 (fp32 grads) + 12


def test_stage_peak_is_the_sum_of_its_components():
    s = scenario("llama2-7b", gpus=8, pp=2, tp=2, zero=1)
    for stage in mem.memory_per_stage(s):
        parts = (stage.params, stage.grads, stage.optimizer, stage.activations, stage.buffers)
        assert all(x > 0 for x in parts)
        assert stage.peak_bytes == sum(parts)


# --- the optimizer step ----------------------------------------------------------------------


@pytest.mark.parametrize("zero, dp", [(0, 4), (1, 4), (2, 4)])
def test_foreach_adam_holds_one_fp32_moment_of_the_optimizer_shard_in_its_step(zero, dp):
    """torch.optim's foreach Adam allocates sqrt(v) for every parameter of the rank's optimizer
    shard at once: 4 bytes per parameter over the ZeRO shards (whole without ZeRO); a fused
    step allocates nothing beyond the states."""
    foreach = scenario(gpt(), gpus=dp, dp=dp, zero=zero,
                       training={"optimizer_impl": "foreach"})
    params = sum(mem.stage_params_per_rank(foreach, 0))
    assert mem.optimizer_step_bytes(foreach, 0) == pytest.approx(
        4 * params / (dp if zero else 1), rel=1e-12)
    fused = scenario(gpt(), gpus=dp, dp=dp, zero=zero)
    assert fused.training.optimizer_impl == "fused"
    assert mem.optimizer_step_bytes(fused, 0) == 0


def test_fp32_master_parameters_free_their_casts_before_the_step():
    """With fp32 parameters as the master (autocast, FSDP below ZeRO-3), forward and backward
    hold a bf16 copy (2 bytes) the step does not: the step holds 4 + 4 + 8 + 4 = 20 bytes per
    parameter against forward and backward's 18 + activations."""
    s = scenario(gpt(), gpus=1, training={"optimizer_impl": "foreach",
                                          "master_weights": "params", "grad_dtype": "fp32"})
    params = sum(mem.stage_params_per_rank(s, 0))
    assert model_states(s) == pytest.approx(18 * params, rel=1e-12)
    assert mem.optimizer_step_bytes(s, 0) == pytest.approx(2 * params, rel=1e-12)


@pytest.mark.parametrize(("training", "zero", "copy"), [
    ({"precision": "fp16"}, 1, 4),  # Megatron-LM: shard_model_grad.float()
    ({"precision": "fp16"}, 0, 4),  # main_grad.float(), every parameter's
    ({"grad_dtype": "bf16"}, 1, 4),
    ({"framework": "deepspeed"}, 1, 4),  # ZeRO-1 keeps bf16 gradients: an fp32 partition
    ({}, 1, 0),  # bf16 with fp32 main gradients: the optimizer steps on them
    ({"grad_dtype": "bf16", "master_weights": "remainders"}, 1, 0),  # decoupled_grad
])
def test_an_fp32_master_steps_on_an_fp32_copy_of_narrower_gradients(training, zero, copy):
    """The step's gradients are cast to the master's fp32 first, 4 bytes per parameter of the
    optimizer's shard (over dp from ZeRO-1), unless they are fp32 already or the optimizer
    reads them in place (Megatron-LM's precision-aware optimizer: master as remainders)."""
    s = scenario(gpt(), gpus=4, dp=4, zero=zero, training=training)
    params = sum(mem.stage_params_per_rank(s, 0))
    assert mem.optimizer_step_bytes(s, 0) == pytest.approx(copy * params / (4 if zero else 1))


def test_deepspeed_zero3_casts_one_sub_group_at_a_time():
    """DeepSpeed's ZeRO-3 steps ``sub_group_size`` (1e9) parameters of its shard at a time and
    drops each one's fp32 gradients before the next: at most 4 GB, however large the shard."""
    s = scenario("llama3-70b", gpus=8, dp=8, zero=3, global_batch=8,
                 training={"framework": "deepspeed"})
    assert sum(mem.stage_params_per_rank(s, 0)) / 8 > 1e9
    assert mem.optimizer_step_bytes(s, 0) == pytest.approx(4 * 1e9)


def test_the_peak_holds_the_larger_of_activations_and_the_step():
    stage = mem.StageMemory(0, params=2.0, grads=4.0, optimizer=12.0, activations=5.0,
                            buffers=1.0, optimizer_step=3.0)
    assert stage.peak_bytes == 2 + 4 + 12 + 1 + 5
    assert mem.StageMemory(0, 2.0, 4.0, 12.0, 1.0, 1.0, optimizer_step=3.0).peak_bytes == 22
