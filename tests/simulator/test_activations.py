"""Activation memory tensor by tensor, against hand-derived oracles from Megatron-Core's and
Transformer Engine's code paths, and published configurations that trained (or did not).

Oracles list, per token, the tensors each op saves for backward (``ctx.save_for_backward``)
in megatron/core/transformer/moe/ (router.py, token_dispatcher.py, experts.py) and
transformer_engine/pytorch/module/ (linear.py, layernorm_linear.py); they are written out
here by hand, not computed by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_helpers import gpt, llama, scenario

import clustersim
from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model import workload as wl
from clustersim.simulator.model.activations import loss_backward_bytes
from clustersim.simulator.model.routing import permutation_bytes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30

# Mixtral-8x7B-shaped MoE layer (Jiang et al. 2024, Table 1), no dropout, 4096 tokens.
MOE = llama(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=4096,
            vocab=32000, experts=8, top_k=2, capacity_factor=None, dropout=0.0)
SEQ, H, F, K = 4096, 4096, 14336, 2


def moe_layer(**kw) -> float:
    kw.setdefault("flash_attention", True)
    return mem.layer_activation_bytes(ModelSpec(**MOE), 1, **kw)


# --- 1. the MoE layer, Megatron-Core's alltoall dispatcher and TEGroupedMLP -----------------

def test_moe_layer_keeps_the_dispatched_tokens_and_their_probabilities_bf16():
    """Per token in bf16 (2 bytes), flash attention, tp = cp = ep = 1, dropless balanced
    routing: the attention as in a dense layer, then the MoE layer's saved tensors."""
    attention = (2 * H + 2 * H        # the two norms' inputs (RMSNorm backward)
                 + 2 * H              # QKV LayerNormLinear's ln_out
                 + 2 * H + 2 * 2 * 1024  # Q, and K and V of 8 heads x 128
                 + 2 * H              # attention output (kernel and linear_proj share it)
                 + 4 * 32)            # fp32 log-sum-exp per head
    moe = (2 * H                      # pre-MLP norm output, the router GEMM's input
           + 4 * 8 + 8 * K            # fp32 scores over 8 experts, int64 top-2 indices
           + 2 * K * H                # the 2 dispatched copies, grouped fc1's input
           + 4 * K                    # their fp32 probabilities (weighted SwiGLU)
           + 2 * K * 2 * F            # fc1's output: gate and up, the SwiGLU's input
           + 2 * K * F)               # the SwiGLU's output, grouped fc2's input
    assert moe_layer() == pytest.approx(SEQ * (attention + moe), rel=1e-12)


def test_moe_layer_under_fp8_keeps_one_byte_gemm_inputs():
    """Transformer Engine saves FP8 copies of its GEMMs' inputs: ln_out, the dispatched tokens
    and fc2's input drop to 1 byte; linear_proj adds its 1-byte copy of the attention output;
    the router (not an FP8 GEMM), the norms' inputs, Q/K/V and fc1's output stay bf16."""
    bf16, fp8 = moe_layer(), moe_layer(precision="fp8")
    saved = H + K * H + K * F - H  # ln_out, dispatched tokens, fc2 input; minus proj's copy
    assert bf16 - fp8 == pytest.approx(SEQ * saved, rel=1e-12)


def test_recompute_modules_drop_what_megatron_core_discards():
    """moe_act: fc2's input (2 K F per token); layernorm: the router's input (2 H), the MoE
    layer's separate pre-MLP norm; the dense attention's norm is fused into its QKV GEMM, so
    layernorm drops nothing there."""
    base = moe_layer()
    act = moe_layer(recompute="selective", modules=frozenset({"moe_act"}))
    norm = moe_layer(recompute="selective", modules=frozenset({"layernorm"}))
    assert base - act == pytest.approx(SEQ * 2 * K * F, rel=1e-12)
    assert base - norm == pytest.approx(SEQ * 2 * H, rel=1e-12)
    dense = ModelSpec(**llama(hidden=H, heads=32, kv_heads=8, ffn_hidden=F, seq_len=SEQ,
                              dropout=0.0))
    assert (mem.layer_activation_bytes(dense, 1, recompute="selective", flash_attention=True,
                                       modules=frozenset({"layernorm"}))
            == mem.layer_activation_bytes(dense, 1, flash_attention=True))


def test_mla_up_projection_recompute_drops_the_per_head_q_k_v():
    """DeepSeek-V3's MLA keeps per token 128 heads of Q and K (192 wide) and V (128) in bf16:
    2 x 128 x (2 x 192 + 128) = 131072 bytes, which mla_up_proj rebuilds in backward."""
    m = ModelSpec(**{**build_scenario(_v3_scenario()).model.model_dump()})
    keep = mem.layer_activation_bytes(m, 1, flash_attention=True, precision="bf16")
    drop = mem.layer_activation_bytes(m, 1, recompute="selective", flash_attention=True,
                                      precision="bf16", modules=frozenset({"mla_up_proj"}))
    assert keep - drop == 4096 * 2 * 128 * (2 * 192 + 128)


def test_padded_capacity_scales_only_the_routed_tensors():
    """At capacity factor 1.25 every expert's buffer holds 1.25x the balanced share (padded):
    the dispatched tokens, their probabilities, fc1's output and fc2's input grow by 25%."""
    m = ModelSpec(**{**MOE, "capacity_factor": 1.25})
    routed = 2 * K * H + 4 * K + 2 * K * 2 * F + 2 * K * F
    got = mem.layer_activation_bytes(m, 1, flash_attention=True) - moe_layer()
    assert got == pytest.approx(SEQ * 0.25 * routed, rel=1e-12)


def test_permutations_move_the_tokens_through_hbm():
    """Forward HBM bytes of the permutations (bf16), tp 1, ep 2 (4 local experts): permute
    and unpermute read/write T and its K copies (2 (T + K T) h), the sort by local expert after
    the dispatch and its inverse before the combine read and write K T rows (4 K T h)."""
    s = build_scenario({"model": MOE, "cluster": {"preset": "dgx-h100", "gpus": 2},
                        "training": {"global_batch": 2}, "parallel": {"ep": 2}})
    per_token = 2 * (2 * (1 + K) + 4 * K) * H
    assert permutation_bytes(s, 2) == pytest.approx(SEQ * per_token, rel=1e-12)


# --- 2. dropout --------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, sp", [(1, False), (4, True)])
def test_without_dropout_a_gpt_layer_keeps_32_sbh_plus_2_as2b(tp, sp):
    """Korthikanti's 34 sbh counts two 1-byte residual dropout masks and his 5 as^2 b the
    attention dropout's mask (1) and output (2): at dropout 0 torch's dropout returns its input
    and saves nothing, leaving sbh/t (32 + 2as/h) (softmax output only)."""
    s, a, h, b = 1024, 16, 1024, 2
    m = ModelSpec(**gpt(layers=1, hidden=h, heads=a, seq_len=s, dropout=0.0))
    got = mem.layer_activation_bytes(m, b, tp=tp, sequence_parallel=sp)
    assert got == pytest.approx(s * b * h / tp * (32 + 2 * a * s / h), rel=1e-12)


def test_llama_family_presets_train_without_dropout():
    """Llama 3, Mixtral and DeepSeek-V3 configs carry attention_dropout 0.0 and no hidden
    dropout; GPT-3 keeps Megatron-LM's default 0.1."""
    for name, dropout in [("llama3-405b", 0.0), ("mixtral-8x7b", 0.0), ("deepseek-v3", 0.0),
                          ("gpt3-175b", 0.1)]:
        assert build_scenario({"model": {"preset": name}, "cluster": {"preset": "dgx-h100",
                               "gpus": 8}, "training": {"global_batch": 8}}).model.dropout \
            == dropout


# --- 3. recompute_modules: validation and cost --------------------------------------------------

def _v3_scenario(**parallel) -> dict:
    return {"model": {"preset": "deepseek-v3", "seq_len": 4096, "layers": 4, "dense_layers": 1},
            "cluster": {"preset": "dgx-h100", "gpus": 8},
            "training": {"global_batch": 8, "precision": "bf16"}, "parallel": parallel}


def test_recompute_modules_need_selective_recomputation():
    with pytest.raises(ScenarioError, match="recompute_modules"):
        build_scenario(_v3_scenario(recompute="none", recompute_modules=["layernorm"]))
    with pytest.raises(ScenarioError, match="recompute_modules"):
        build_scenario(_v3_scenario(recompute="selective", recompute_modules=["moe"]))


def test_mla_up_projection_recompute_is_paid_in_hardware_flops_and_time():
    """Re-running the up-projections adds 2 s (d_c' a d_qk + d_c a (d_h + d_v)) FLOPs per
    layer and sequence to the hardware FLOPs (not the model FLOPs), and backward time."""
    plain = build_scenario(_v3_scenario(recompute="selective"))  # core_attn alone
    up = build_scenario(_v3_scenario(recompute="selective",
                                     recompute_modules=["core_attn", "mla_up_proj"]))
    per_layer = 2 * 4096 * (1536 * 128 * 192 + 512 * 128 * (128 + 128))
    assert wl.model_flops_per_step(up) == wl.model_flops_per_step(plain)
    assert wl.hardware_flops_per_step(up) - wl.hardware_flops_per_step(plain) == pytest.approx(
        4 * 8 * per_layer, rel=1e-12)
    assert CostModel(up).per_layer[1] > CostModel(plain).per_layer[1]


def test_norm_and_activation_recompute_cost_their_hbm_traffic():
    """layernorm re-runs MLA's input norm and the MoE pre-MLP norm (read and write T h each),
    moe_act the SwiGLU (read 2 f, write f per routed row): backward grows by those bytes at
    the profile's HBM rate."""
    plain = CostModel(build_scenario(_v3_scenario(recompute="selective")))
    both = CostModel(build_scenario(_v3_scenario(
        recompute="selective", recompute_modules=["core_attn", "layernorm", "moe_act"])))
    h, f, k = 7168, 2048, 8
    rerun = 4096 * 2 * (2 * 2 * h + 3 * k * f)
    assert both.per_layer[1] - plain.per_layer[1] == pytest.approx(
        plain.memory_bound(rerun), rel=1e-9)


# --- 4. published configurations: trained fine, or out of memory --------------------------------

@pytest.mark.parametrize("example", [
    "llama3-405b-8k-meta-h100.yaml",  # Dubey et al. 2024, Table 4 and sec. 3.3.2
    "llama3-70b-fp8-nemo-h100.yaml",  # Megatron-Bridge FP8 recipe, tp4 pp8 vp5, no recompute
    "gpt3-175b-fp8-nemo-h100.yaml",   # NeMo performance summary 24.12, micro-batch 2
    "deepseek-v3-h800.yaml",          # DeepSeek-V3 report, sec. 3.2-3.3
])
def test_published_runs_that_trained_fit(example):
    result = clustersim.simulate(str(EXAMPLES / example)).to_dict()["memory"]
    assert result["fits"], f"{example}: {result['peak_bytes'] / GIB:.1f} GiB"


def test_deepseek_v3_does_not_fit_without_its_recomputation():
    """Keeping everything (no recompute_modules), DeepSeek-V3's DualPipeV stages hold well over
    80 GB: the report's RMSNorm, MLA up-projection and SwiGLU recomputation is what fits it."""
    result = clustersim.simulate(str(EXAMPLES / "deepseek-v3-h800.yaml"),
                                 parallel__recompute="none",
                                 parallel__recompute_modules=None).to_dict()["memory"]
    assert not result["fits"]


def test_published_out_of_memory_run_stays_out_of_memory():
    """BLOOM's 181B prequel (bigscience-workshop/bigscience, train/tr11-176B-ml/
    chronicles-prequel.md, 2022-02-25 tables): dp 48, tp 8, pp 1, micro-batch 1 on 384 A100
    80GB went out of memory (72 layers of h 14336, vocab 250k, fp16, ZeRO-1, full recompute)."""
    s = {"model": {"layers": 72, "hidden": 14336, "heads": 64, "seq_len": 2048,
                   "ffn_hidden": 57344, "vocab": 250000},
         "cluster": {"preset": "dgx-a100-80gb", "gpus": 384},
         "training": {"global_batch": 2016, "micro_batch": 1, "precision": "fp16",
                      "flash_attention": False},
         "parallel": {"tp": 8, "pp": 1, "dp": 48, "zero": 1, "recompute": "full"}}
    assert not clustersim.simulate(s).to_dict()["memory"]["fits"]


@pytest.mark.parametrize("kernel, tp, per_logit", [
    ("pytorch", 1, 8),  # nll_loss's and log_softmax's fp32 gradients beside the log-probs
    ("pytorch", 4, 12),  # loss parallelism: zeros, exp and their sum, each fp32, at once
    ("vocab_parallel", 4, 2),  # the bf16 cast of the in-place gradient
    ("fused", 1, 2),  # the fused kernel's bf16 gradient
])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_loss_backward_allocates_per_logit_shard(kernel, tp, per_logit, precision):
    """Bytes per logit on one rank (T tokens x V / tp vocabulary entries) that the loss's
    backward allocates beside what its forward kept (torch/distributed/tensor/parallel/loss.py,
    megatron/core/tensor_parallel/cross_entropy.py, flash_attn/losses/cross_entropy.py); in
    fp32 the in-place loss casts nothing and the fused kernel writes an fp32 gradient."""
    if precision == "fp32" and kernel != "pytorch":
        per_logit = 0 if kernel == "vocab_parallel" else 4
    m = ModelSpec(**llama())
    tokens = 8192
    expected = per_logit * tokens * m.vocab / tp
    assert loss_backward_bytes(m, tokens, tp, precision, kernel) == pytest.approx(expected)


@pytest.mark.parametrize("tp", [2, 4])
def test_layers_that_keep_their_gathered_input_keep_it_whole(tp):
    """torchtitan's DTensor plan (``tp_keeps_gathered_inputs``): with sequence parallelism the
    attention's and the MLP's column-parallel input, and the output layer's, are kept as
    gathered, ``e T h`` each instead of ``e T h / t``: per layer ``2 e T h (1 - 1/t)`` more, and
    ``e T h (1 - 1/t)`` for the output layer (no checkpointing, one stage)."""
    def held(keep: bool) -> float:
        s = scenario(llama(), gpus=tp, global_batch=1, tp=tp, sequence_parallel=True,
                     tp_keeps_gathered_inputs=keep)
        return mem.stage_activation_bytes(s, 0)

    s = scenario(llama(), gpus=tp, global_batch=1, tp=tp, sequence_parallel=True)
    m = s.model
    whole = 2 * m.seq_len * m.hidden * (1 - 1 / tp)  # bf16 T h, less its shard
    assert held(True) - held(False) == pytest.approx((2 * m.layers + 1) * whole, rel=1e-12)


@pytest.mark.parametrize("framework, kept", [("megatron", False), ("fsdp", True)])
def test_each_stack_keeps_its_own_column_inputs(framework, kept):
    """Megatron-LM's ColumnParallelLinear keeps the shard and gathers again; torchtitan keeps
    the gathered tensor (docs/frameworks.md)."""
    s = build_scenario({"model": llama(), "cluster": {"preset": "dgx-h100", "gpus": 4},
                        "training": {"global_batch": 4, "framework": framework},
                        "parallel": {"tp": 4, "dp": 1, "sequence_parallel": True}})
    assert s.parallel.gathered_inputs_kept is kept
