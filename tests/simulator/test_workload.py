"""FLOP accounting (SCENARIO.md) against Narayanan et al. 2021's closed form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl


def gpt(layers=4, hidden=256, heads=8, vocab=1000, seq_len=128, **kw) -> dict:
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab,
            "seq_len": seq_len, **kw}


def scenario(model: dict, recompute="none", global_batch=16, flash_attention=None):
    training = {"global_batch": global_batch}
    if flash_attention is not None:
        training["flash_attention"] = flash_attention
    return build_scenario({"model": model, "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                           "training": training, "parallel": {"recompute": recompute}})


@given(layers=st.integers(1, 96), h_per_head=st.sampled_from([64, 128]),
       heads=st.sampled_from([8, 16, 32]), seq=st.sampled_from([512, 2048, 4096]),
       vocab=st.integers(1000, 200_000), batch=st.sampled_from([8, 64]))
def test_hardware_flops_with_full_recompute_match_narayanan(layers, h_per_head, heads, seq,
                                                            vocab, batch):
    """F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)): 4x forward for layers, 3x for logits."""
    h = h_per_head * heads
    s = scenario(gpt(layers, h, heads, vocab, seq), recompute="full", global_batch=batch)
    closed = 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    assert wl.hardware_flops_per_step(s) == pytest.approx(closed, rel=1e-9)


def test_model_flops_are_three_forwards_without_recompute():
    """Model FLOPs never count recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    m = gpt(layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048)
    for recompute in ("none", "selective", "full"):
        s = scenario(m, recompute=recompute, global_batch=512)
        b, sq, l, h, v = 512, 2048, 24, 2304, 51200
        closed = 72 * b * sq * l * h * h * (1 + sq / (6 * h) + v / (12 * l * h))
        assert wl.model_flops_per_step(s) == pytest.approx(closed, rel=1e-12)


def test_selective_recompute_reruns_only_the_attention_core_without_flash_attention():
    s = scenario(gpt(seq_len=1024), recompute="selective", flash_attention=False)
    extra = wl.hardware_flops_per_step(s) - wl.model_flops_per_step(s)
    assert extra == pytest.approx(4 * 1024**2 * 256 * 4 * 16)  # 4 s^2 h per layer, sequence


def _tflops_time_memory(recompute: str, flash: bool):
    s = scenario(gpt(seq_len=1024), recompute=recompute, flash_attention=flash)
    r = simulate(s)
    return r.hardware_tflops_per_gpu, r.step_time_s, r.peak_bytes


def test_with_flash_attention_selective_reruns_the_fused_attention_for_no_memory():
    """Megatron-Core checkpoints the core attention whatever kernel runs it
    (megatron/core/transformer/attention.py), so selective re-runs the flash forward: its
    FLOPs (counted as without flash, 4 s^2 h per layer and sequence) and its time, for the
    memory of none (a fused kernel keeps no scores)."""
    s = scenario(gpt(seq_len=1024), recompute="selective", flash_attention=True)
    extra = wl.hardware_flops_per_step(s) - wl.model_flops_per_step(s)
    assert extra == pytest.approx(4 * 1024**2 * 256 * 4 * 16)
    _, none_time, none_peak = _tflops_time_memory("none", True)
    _, sel_time, sel_peak = _tflops_time_memory("selective", True)
    assert sel_time > none_time and sel_peak == none_peak


def test_without_flash_attention_selective_hardware_flops_exceed_none_by_the_attention_core():
    none_tf, none_time, _ = _tflops_time_memory("none", False)
    sel_tf, sel_time, _ = _tflops_time_memory("selective", False)
    core = 4 * 1024**2 * 256 * 4 * 16  # 4 s^2 h per layer and sequence, 4 layers, batch 16
    per_gpu_extra = (sel_tf * sel_time - none_tf * none_time) * 1e12  # FLOPs per GPU per step
    assert per_gpu_extra == pytest.approx(core / 8, rel=1e-9)


def test_gqa_and_swiglu_in_the_layer_flops():
    """QKV shrinks to 2sh(h + 2 h_kv); SwiGLU has three h x f matrices."""
    m = ModelSpec(**gpt(hidden=512, heads=8, kv_heads=2, ffn_hidden=1024, ffn_kind="swiglu"))
    s, h, hkv, f = 128, 512, 128, 1024
    expected = 2 * s * h * (h + 2 * hkv) + 4 * s * s * h + 2 * s * h * h + 2 * 3 * s * h * f
    assert wl.layer_forward_flops(m) == expected


def test_a_head_width_of_its_own_sets_the_query_and_output_projections():
    """Qwen3-style heads: ``a d`` query and attention-output columns, not ``h``:
    ``2s h(a d + 2 h_kv) + 4 s^2 a d + 2 s a d h`` (QKV, scores and values, output)."""
    m = ModelSpec(**gpt(hidden=512, heads=8, kv_heads=2, head_dim=128))
    s, h, q, hkv = 128, 512, 8 * 128, 2 * 128
    assert wl.layer_forward_flops(m) == (2 * s * h * (q + 2 * hkv) + 4 * s * s * q
                                         + 2 * s * q * h + 2 * 2 * s * h * 4 * h)
    assert pc.attention_weights(m) == h * (q + 2 * hkv) + q * h
    qkv, out = wl._attention_projections(scenario(gpt(hidden=512, heads=8, kv_heads=2,
                                                      head_dim=128)), tokens=128)
    assert (qkv.n, qkv.k, out.n, out.k) == (q + 2 * hkv, h, h, q)
    # Left out, the width is hidden / heads, and a model with it written out is the same model.
    assert ModelSpec(**gpt(head_dim=32)).query_width == ModelSpec(**gpt()).query_width == 256


def test_a_head_width_of_its_own_frees_hidden_from_dividing_by_heads():
    # 3000 / 64 is no head width; 64 heads of 64 over it are a model
    assert ModelSpec(**gpt(hidden=3000, heads=64, kv_heads=8, head_dim=64)).query_width == 4096
    with pytest.raises(ValueError, match="divisible by heads"):
        ModelSpec(**gpt(hidden=3000, heads=64, kv_heads=8))


def test_moe_layers_count_top_k_experts_per_token_and_every_expert_in_params():
    dense = ModelSpec(**gpt(ffn_kind="swiglu"))
    moe = ModelSpec(**gpt(ffn_kind="swiglu", experts=8, top_k=2))
    mlp = 2 * 3 * 128 * 256 * 1024
    assert wl.layer_forward_flops(moe) - wl.layer_forward_flops(dense) == mlp
    assert pc.mlp_params(moe) == 8 * pc.expert_params(dense) + 256 * 8


def test_tied_embeddings_hold_one_vocabulary_matrix():
    tied = ModelSpec(**gpt(tie_embeddings=True))
    untied = ModelSpec(**gpt(tie_embeddings=False))
    assert pc.total_params(untied) - pc.total_params(tied) == 1000 * 256


@pytest.mark.parametrize("model, total, activated", [
    # DeepSeek-V3 report (arXiv 2412.19437) abstract: "671B total parameters with 37B
    # activated for each token"
    ({"preset": "deepseek-v3"}, 671e9, 37e9),
    # DeepSeek-V2 report (arXiv 2405.04434) abstract: "236B total parameters, of which 21B are
    # activated for each token"; shape from its sec. 3.1.2 (60 layers, hidden 5120, 128 heads,
    # KV latent 512, query latent 1536, RoPE 64, 2 shared + 160 routed experts of 1536, top 6,
    # first layer dense of 12288; vocabulary 102400)
    ({"layers": 60, "hidden": 5120, "heads": 128, "ffn_hidden": 1536, "vocab": 102400,
      "seq_len": 4096, "experts": 160, "top_k": 6, "shared_experts": 2, "dense_layers": 1,
      "dense_ffn_hidden": 12288, "q_lora_rank": 1536, "kv_lora_rank": 512,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "norm": "rmsnorm",
      "bias": False, "position_embedding": "rope", "tie_embeddings": False,
      "ffn_kind": "swiglu"}, 236e9, 21e9),
])
def test_deepseek_total_and_activated_parameters_are_the_published_ones(model, total,
                                                                        activated):
    m = scenario(model).model
    # as printed: within half of the last digit
    assert abs(pc.total_params(m) - total) < 0.5e9
    assert abs(pc.activated_params(m) - activated) < 0.5e9


def test_activated_parameters_of_a_dense_model_are_all_but_the_embedding_lookup():
    m = scenario(gpt(tie_embeddings=False, position_embedding="rope")).model
    assert pc.activated_params(m) == pc.total_params(m) - m.vocab * m.hidden


@pytest.mark.parametrize(("sequence_parallel", "scatter_gather", "split", "gathered"), [
    (False, False, 1, 0), (True, False, 4, 0), (False, True, 4, 1), (True, True, 4, 0)])
def test_pipeline_message_split_by_sequence_parallelism_or_scatter_gather(
        sequence_parallel, scatter_gather, split, gathered):
    """Megatron-Core sends the ``(s, b, h)`` activation between stages from every TP rank, and
    only ``s/tp`` of it under sequence parallelism (p2p_communication.py's tensor shape);
    Megatron-LM's scatter-gather (Narayanan et al. 2021 sec. 4.1) sends ``1/tp`` of it from
    each rank and all-gathers the whole on arrival; sequence parallelism needs no gather."""
    s = build_scenario({"model": gpt(hidden=512, seq_len=256),
                        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                        "training": {"global_batch": 8, "micro_batch": 2},
                        "parallel": {"tp": 4, "pp": 2, "sequence_parallel": sequence_parallel,
                                     "pp_scatter_gather": scatter_gather}})
    whole = 2 * 256 * 512 * 2  # b s h in bf16
    assert wl.pipeline_message_bytes(s) == whole / split
    assert wl.pipeline_gather_bytes(s) == whole * gathered


@pytest.mark.parametrize(("framework", "scatter_gather"), [
    ("megatron", True), ("deepspeed", True), ("fsdp", False)])
def test_pipeline_scatter_gather_follows_the_framework(framework, scatter_gather):
    """Megatron-LM's --scatter-gather-tensors-in-pipeline and DeepSpeed's partitioned pipe
    sends are on by default; PyTorch pipelining sends whole outputs (docs/frameworks.md)."""
    s = build_scenario({"model": gpt(hidden=512, seq_len=256),
                        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                        "training": {"global_batch": 8, "micro_batch": 2,
                                     "framework": framework},
                        "parallel": {"tp": 4, "pp": 2, "zero": 1}})
    assert s.parallel.pp_scatter_gather is scatter_gather


@pytest.mark.parametrize("flash_attention", [True, False])
def test_without_dropout_no_dropout_kernel_moves_bytes(flash_attention):
    """torch's ``dropout`` returns its input at probability 0, so a layer without dropout moves
    what its dropouts would have, and no more: per residual branch, Megatron-LM's fused
    bias-dropout-add writes no one-byte mask (0.5 bytes a hidden element less forward) and no
    dropout backward reads the gradient and the mask and writes the branch's (2.5 less); unfused
    attention's dropout over the ``heads/tp x s x s`` probabilities reads and writes them and a
    mask (2.5 bytes of the activation's width a score forward, as much backward). Two branches a
    layer; bf16 (2 bytes); one 128-token sequence a micro-batch; 8 heads on tp 1."""
    def bytes_of(dropout: float) -> tuple[float, float]:
        s = build_scenario({"model": gpt(dropout=dropout),
                            "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                            "training": {"global_batch": 16, "flash_attention": flash_attention}})
        k = wl.layer_kernels(s)
        return k.memory_bytes, k.backward_memory_bytes
    tokens, hidden, act, scores = 128, 256, 2, 8 * 128 * 128
    attention = 0 if flash_attention else 2.5 * act * scores
    with_dropout, without = bytes_of(0.1), bytes_of(0.0)
    assert with_dropout[0] - without[0] == pytest.approx(2 * 0.5 * tokens * hidden * act
                                                         + attention)
    assert with_dropout[1] - without[1] == pytest.approx(2 * 2.5 * tokens * hidden * act
                                                         + attention)


def test_rope_reads_and_writes_every_rotated_query_and_key_element():
    """Megatron-LM rotates q and k with Transformer Engine's fused RoPE unless told
    ``--no-rope-fusion``: one read and one write of each element, forward and backward alike.
    8 query heads of 32 over tp 2 (128 columns a rank) and 2 KV heads (one a rank, 32 columns);
    one 128-token sequence in bf16: 2 x 2 x 128 x (128 + 32) bytes more than learned positions,
    which rotate nothing."""
    def bytes_of(position_embedding: str) -> tuple[float, float]:
        s = build_scenario({"model": gpt(kv_heads=2, position_embedding=position_embedding),
                            "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
                            "training": {"global_batch": 16}, "parallel": {"tp": 2}})
        k = wl.layer_kernels(s)
        return k.memory_bytes, k.backward_memory_bytes
    rope, learned = bytes_of("rope"), bytes_of("learned")
    assert rope[0] - learned[0] == rope[1] - learned[1] == 2 * 2 * 128 * (128 + 32)
