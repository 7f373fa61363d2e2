"""Multi-head latent attention (simulator/model/latent.py): parameters, FLOPs, GEMMs, activations
and K/V messages of DeepSeek-V2/V3's attention. Oracles: the layer layout of transformers'
DeepseekV3Attention counted by hand, DeepSeek's published sizes and FLOPs per token, and MHA's
formulas where MLA's head widths equal ``h / a``."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model import context_messages as cpm
from clustersim.simulator.model import latent
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl

V3_ATTENTION = {"heads": 128, "kv_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
LLAMA_LIKE = {"norm": "rmsnorm", "bias": False, "position_embedding": "rope",
              "tie_embeddings": False, "ffn_kind": "swiglu"}


def v3_attention_model(**kw) -> ModelSpec:
    """DeepSeek-V3's attention on a dense SwiGLU model (report arXiv 2412.19437 sec. 4.2)."""
    return ModelSpec(**{"layers": 2, "hidden": 7168, "ffn_hidden": 18432, "vocab": 1000,
                        "seq_len": 4096, **LLAMA_LIKE, **V3_ATTENTION, **kw})


def scenario(model: dict, tp=1, cp=1, global_batch=8, gpus=8):
    return build_scenario({"model": model, "cluster": {"preset": "dgx-h100", "gpus": gpus},
                           "training": {"global_batch": global_batch},
                           "parallel": {"tp": tp, "cp": cp}})


def test_deepseek_v3_attention_has_the_parameters_of_its_published_layers():
    # transformers DeepseekV3Attention: q_a_proj Linear(7168, 1536), q_a_layernorm (1536),
    # q_b_proj Linear(1536, 128*192), kv_a_proj_with_mqa Linear(7168, 512+64), kv_a_layernorm
    # (512), kv_b_proj Linear(512, 128*(128+128)), o_proj Linear(128*128, 7168); no biases
    by_hand = (7168 * 1536 + 1536 + 1536 * 24576 + 7168 * 576 + 512 + 512 * 32768
               + 16384 * 7168)
    assert by_hand == 187_107_328
    assert pc.attention_params(v3_attention_model()) == by_hand


def test_without_a_query_latent_the_query_is_one_full_projection():
    # DeepSeek-V2-Lite (V2 report Appendix B): q_proj Linear(2048, 16*192), no query latent
    m = ModelSpec(layers=2, hidden=2048, heads=16, kv_heads=16, ffn_hidden=10944, vocab=1000,
                  seq_len=4096, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                  v_head_dim=128, **LLAMA_LIKE)
    by_hand = 2048 * 3072 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    assert pc.attention_params(m) == by_hand


def test_mla_gemms_multiply_by_every_projection_weight_once():
    m = v3_attention_model()
    gemms = latent.gemms(m, tokens=4096)
    assert sum(g.n * g.k for g in gemms) == latent.projection_weights(m)
    assert [g.m for g in gemms] == [4096] * 5


def test_attention_core_flops_are_2_s2_a_over_query_and_value_widths():
    # scores s x s x d_qk and values s x s x d_v per head, full square (SCENARIO.md)
    m = v3_attention_model()
    assert wl.attention_core_forward_flops(m) == 2 * 4096**2 * 128 * (192 + 128)


def test_with_head_widths_of_h_over_a_the_attention_core_is_mha_s_4s2h():
    mla = ModelSpec(layers=2, hidden=1024, heads=8, vocab=100, seq_len=512, kv_lora_rank=64,
                    qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=128, bias=False)
    mha = ModelSpec(layers=2, hidden=1024, heads=8, vocab=100, seq_len=512)
    assert wl.attention_core_forward_flops(mla) == wl.attention_core_forward_flops(mha)
    assert wl.attention_core_forward_flops(mha) == 4 * 512**2 * 1024


@pytest.mark.parametrize("preset, tflops_per_token", [
    # Zhao et al. 2025, "Insights into DeepSeek-V3" (ISCA '25, arXiv 2505.09343) Table 2:
    # training cost per token at sequence length 4096, attention's causal half counted
    ("deepseek-v3", 250e9),
    ("deepseek-v2", 155e9),
])
def test_flops_per_token_reproduce_deepseeks_figures_with_the_causal_half(preset,
                                                                         tflops_per_token):
    models = {"deepseek-v3": {"preset": "deepseek-v3", "seq_len": 4096},
              # DeepSeek-V2 (report arXiv 2405.04434 sec. 3.1.2): 60 layers, hidden 5120, 2
              # shared + 160 routed experts of 1536, top 6, first layer dense (12288)
              "deepseek-v2": {"layers": 60, "hidden": 5120, "ffn_hidden": 1536, "vocab": 102400,
                              "seq_len": 4096, "experts": 160, "top_k": 6, "shared_experts": 2,
                              "dense_layers": 1, "dense_ffn_hidden": 12288, **LLAMA_LIKE,
                              **V3_ATTENTION}}
    s = scenario(models[preset])
    m = s.model
    tokens = s.training.global_batch * m.seq_len
    per_token = wl.model_flops_per_step(s) / tokens
    # SCENARIO.md counts the full s x s square; DeepSeek's figure counts its causal half
    causal_half = 3 * m.layers * wl.attention_core_forward_flops(m) / m.seq_len / 2
    assert per_token - causal_half == pytest.approx(tflops_per_token, rel=0.01)


def test_model_flops_are_6_activated_matmul_weights_plus_the_attention_term():
    s = scenario({"preset": "deepseek-v3", "seq_len": 4096})
    m = s.model
    tokens = s.training.global_batch * m.seq_len
    # activated parameters less what is no matmul: 2 RMSNorms per layer, MLA's latent norms,
    # the final norm and the h x 256 routers of the 58 MoE layers
    norms = m.layers * (2 * 7168 + 1536 + 512) + 7168
    routers = 58 * 7168 * 256
    weights = pc.activated_params(m) - norms - routers
    attention = 3 * 61 * 2 * 4096 * 128 * (192 + 128)  # per token: 3 x 2 s a (d_qk + d_v)
    assert wl.model_flops_per_step(s) / tokens == pytest.approx(6 * weights + attention,
                                                                rel=1e-12)


def test_mla_activations_count_its_per_head_tensors_and_latents_korthikanti_style():
    m = v3_attention_model(experts=256, top_k=8, ffn_hidden=2048, shared_experts=1)
    # bytes per token, bf16 (e = 2), flash attention: Q and K 128 x 192, V and output 128 x 128,
    # each latent twice (norm input, up-projection input: 2 x (1536 + 512)), SwiGLU's three
    # f-wide tensors over 8 routed + 1 shared experts of 2048; outside: four h-wide tensors
    # (e each) and two 1-byte masks; the fp32 log-sum-exp per head; the MoE layer's dispatched
    # tokens (8 copies of h, fc1's input), their fp32 routing probabilities and the router's
    # fp32 scores over 256 experts and int64 top-8 indices (Megatron-Core's alltoall path)
    inside = 2 * (2 * 128 * 192 + 2 * 128 * 128 + 2 * (1536 + 512) + 3 * 9 * 2048)
    outside = 7168 * (4 * 2 + 2)
    lse = 4 * 128
    moe = 2 * 8 * 7168 + 4 * 8 + 4 * 256 + 8 * 8
    got = mem.layer_activation_bytes(m, micro_batch=1, flash_attention=True)
    assert got == 4096 * (inside + outside + lse + moe)


def test_ring_attention_passes_per_head_keys_and_values():
    s = scenario({**v3_attention_model().model_dump(), "layers": 2}, cp=2, gpus=2,
                 global_batch=2)
    # this rank's 2048 tokens x 128 heads x (192 + 128), bf16
    assert cpm.cp_kv_block_bytes(s) == 2048 * 128 * 320 * 2


@pytest.mark.parametrize("change, message", [
    ({"qk_rope_head_dim": None}, "needs qk_rope_head_dim"),
    ({"kv_lora_rank": None}, "q_lora_rank is a latent-attention field"),
    ({"kv_heads": 16}, "kv_heads (16) must equal heads (128)"),
    ({"bias": True}, "bias: true is not modelled"),
    ({"head_dim": 128}, "head_dim is not a latent-attention field"),
])
def test_incomplete_or_unmodelled_latent_attention_is_bad_input(change, message):
    raw = {**v3_attention_model().model_dump(), **change}
    with pytest.raises(ScenarioError, match=r"^model: .*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        scenario(raw)
