"""Per-rank memory against the published closed forms.

Model states: Rajbhandari et al. 2020 (ZeRO), sec. 3.1 and Figure 1. One layer's activations:
Korthikanti et al. 2022 (Reducing Activation Recomputation), eq. (1)-(5). What a pipeline stage
holds (in-flight micro-batches, the output layer and loss): test_stage_activations.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_helpers import GB, gpt, llama, model_states, scenario

from clustersim.errors import ScenarioError
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import optimizer_states
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model import param_counts as pc

# --- 1. model states: the ZeRO table -------------------------------------------------------------

@pytest.mark.parametrize("zero, expected_gb", [(0, 112.0), (1, 38.5), (2, 26.25), (3, 14.0)])
def test_zero_table_for_7b_parameters_on_8_gpus(zero, expected_gb):
    """ZeRO Fig. 1 with Psi = 7B, N = 8, K = 12: 16Psi, 4Psi + 12Psi/N, 2Psi + 14Psi/N, 16Psi/N."""
    assert sum(optimizer_states.model_state_bytes(7e9, 8, zero)) / GB == pytest.approx(expected_gb)


@pytest.mark.parametrize("zero, printed_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1_as_printed(zero, printed_gb):
    """ZeRO Fig. 1 itself: Psi = 7.5B on N_d = 64 GPUs prints 120 / 31.4 / 16.6 / 1.9 GB."""
    got = sum(optimizer_states.model_state_bytes(7.5e9, 64, zero)) / GB
    assert got == pytest.approx(printed_gb, abs=0.05)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_llama2_7b_on_8_data_parallel_gpus_follows_the_zero_table(zero):
    """With bf16 gradients (the ZeRO paper's setting), stage 0 with dp = 8, tp = pp = 1 holds
    16P, 4P + 12P/8, 2P + 14P/8, 16P/8 (P: all params)."""
    s = scenario("llama2-7b", gpus=8, zero=zero, training={"grad_dtype": "bf16"})
    assert (s.parallel.dp, s.parallel.tp, s.parallel.pp) == (8, 1, 1)
    big_p = pc.total_params(s.model)
    expected = {0: 16 * big_p, 1: 4 * big_p + 12 * big_p / 8, 2: 2 * big_p + 14 * big_p / 8,
                3: 16 * big_p / 8}[zero]
    assert model_states(s) == pytest.approx(expected, rel=1e-12)
    stage = mem.memory_per_stage(s)[0]
    assert stage.params + stage.grads + stage.optimizer == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_bf16_training_keeps_fp32_main_gradients_by_default(zero):
    """Megatron-LM's default under bf16: 2 + 4 + 12 = 18 bytes per parameter, so the table reads
    18P, 6P + 12P/8, 2P + 16P/8, 18P/8."""
    s = scenario("llama2-7b", gpus=8, zero=zero)
    assert s.training.grad_dtype == "fp32"
    big_p = pc.total_params(s.model)
    expected = {0: 18 * big_p, 1: 6 * big_p + 12 * big_p / 8, 2: 2 * big_p + 16 * big_p / 8,
                3: 18 * big_p / 8}[zero]
    assert model_states(s) == pytest.approx(expected, rel=1e-12)


# Bytes per parameter (weights, gradients, optimizer state) before sharding, with the scenario's
# default gradient type (fp32 main gradients under bf16, as Megatron-LM; else the precision):
#   bf16 Adam:  2 + 4 + (4 fp32 master + 4 momentum + 4 variance) = 18
#   fp16 Adam:  2 + 2 + (4 fp32 master + 4 momentum + 4 variance) = 16
#   fp32 Adam:  4 + 4 + (4 momentum + 4 variance)                  = 16 (no master copy)
#   bf16 SGD:   2 + 4 + (4 fp32 master + 4 momentum)               = 14
#   fp32 SGD:   4 + 4 + 4 momentum                                 = 12
BYTES_PER_PARAM = [("bf16", "fp32", "adam", 2, 4, 12), ("fp16", "fp16", "adam", 2, 2, 12),
                   ("fp32", "fp32", "adam", 4, 4, 8), ("bf16", "fp32", "sgd", 2, 4, 8),
                   ("fp32", "fp32", "sgd", 4, 4, 4)]


@pytest.mark.parametrize("precision, grad_dtype, optimizer, w, g, o", BYTES_PER_PARAM)
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_for_each_precision_and_optimizer(precision, grad_dtype, optimizer, w, g,
                                                       o, zero):
    """ZeRO-z divides the optimizer state by N from z = 1, gradients from 2, weights at 3."""
    n, params = 8, 1e9
    expected = (params * w / (n if zero >= 3 else 1), params * g / (n if zero >= 2 else 1),
                params * o / (n if zero >= 1 else 1))
    got = optimizer_states.model_state_bytes(params, n, zero, precision, optimizer, grad_dtype)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("precision, grad_dtype, optimizer, w, g, o", BYTES_PER_PARAM)
def test_scenario_model_states_use_the_training_precision_and_optimizer(precision, grad_dtype,
                                                                        optimizer, w, g, o):
    """Through a scenario (ZeRO-1, dp = 8): (w + g) P + o P / 8, gradients of the default type."""
    s = scenario("llama2-7b", gpus=8, training={"precision": precision, "optimizer": optimizer},
                 zero=1)
    assert s.training.grad_dtype == grad_dtype
    big_p = pc.total_params(s.model)
    assert model_states(s) == pytest.approx((w + g) * big_p + o * big_p / 8, rel=1e-12)


# Optimizer state per parameter (bf16 Adam) as each stack keeps it, before sharding:
#   Megatron-LM, DeepSpeed (fp32 master, fp32 moments):                 4 + 4 + 4 = 12
#   DeepSeek-V3 (fp32 master, bf16 moments; report sec. 3.3.3):         4 + 2 + 2 = 8
#   apex DistributedFusedAdam as NeMo ran it (16-bit master remainder): 2 + 4 + 4 = 10
#   the same with dtype bf16 (no master, bf16 moments):                 0 + 2 + 2 = 4
#   Megatron-LM's precision-aware optimizer, fp8 moments + remainders:  2 + 1 + 1 = 4
OPTIMIZER_STATES = [("optimizer", "fp32", 12), ("optimizer", "bf16", 8),
                    ("remainders", "fp32", 10), ("none", "bf16", 4), ("remainders", "fp8", 4)]


@pytest.mark.parametrize("master, moments, o", OPTIMIZER_STATES)
def test_optimizer_state_as_each_stack_keeps_it(master, moments, o):
    """Through a scenario (bf16 gradients, ZeRO-1, dp 8): 4 P + o P / 8."""
    s = scenario("llama2-7b", gpus=8, zero=1,
                 training={"grad_dtype": "bf16", "master_weights": master,
                           "optimizer_moments": moments})
    big_p = pc.total_params(s.model)
    assert model_states(s) == pytest.approx(4 * big_p + o * big_p / 8, rel=1e-12)


@pytest.mark.parametrize("training, field", [
    ({"precision": "fp16", "master_weights": "remainders"}, "training.master_weights"),
    ({"precision": "fp32", "master_weights": "remainders"}, "training.master_weights"),
    ({"precision": "fp8", "fp8_param_gather": True, "master_weights": "remainders"},
     "training.master_weights"),
    ({"precision": "fp8", "fp8_param_gather": True, "master_weights": "none"},
     "training.master_weights"),
    ({"optimizer_moments": "fp64"}, "training.optimizer_moments")])
def test_a_master_or_moments_the_weights_cannot_have_are_refused(training, field):
    """Remainders complete bf16 weights only; FP8 parameters are cast from a whole master."""
    with pytest.raises(ScenarioError) as err:
        scenario("llama2-7b", gpus=8, zero=1, training=training, cluster="dgx-h100")
    assert field in str(err.value)


def test_expert_states_shard_over_the_ranks_that_replicate_each_expert():
    """MoE under ZeRO-3: dense params over dp*cp ranks, each expert over dp*cp/ep (Megatron-LM)."""
    s = scenario(llama(hidden=256, heads=8, experts=4, top_k=2), gpus=8, zero=3, ep=4,
                 training={"grad_dtype": "bf16"})
    dense, expert = mem.stage_params_per_rank(s, 0)
    assert expert > 0
    assert model_states(s) == pytest.approx(16 * dense / 8 + 16 * expert / 2, rel=1e-12)


# --- 2. activations per layer: Korthikanti et al. 2022 --------------------------------------------

shapes = st.fixed_dictionaries({
    "s": st.sampled_from([256, 512, 1024, 2048, 4096]), "b": st.integers(1, 8),
    "a": st.sampled_from([8, 16, 32, 64]), "head_dim": st.sampled_from([32, 64, 128]),
    "t": st.sampled_from([1, 2, 4, 8])})


def gpt_spec(s: int, a: int, head_dim: int) -> ModelSpec:
    """Korthikanti's GPT layer: kv_heads = heads, ffn_hidden = 4h, GELU."""
    return ModelSpec(**gpt(layers=1, hidden=a * head_dim, heads=a, seq_len=s))


def act(m: ModelSpec, b: int, t: int = 1, **kw) -> float:
    kw.setdefault("flash_attention", False)
    return mem.layer_activation_bytes(m, b, tp=t, **kw)


@given(shapes)
def test_activations_without_parallelism_are_sbh_34_plus_5as_over_h(x):
    """Korthikanti eq. (1): sbh(34 + 5as/h) bytes per layer."""
    s, b, a = x["s"], x["b"], x["a"]
    h = a * x["head_dim"]
    assert act(gpt_spec(s, a, x["head_dim"]), b) == pytest.approx(
        s * b * h * (34 + 5 * a * s / h), rel=1e-12)


@given(shapes)
def test_tensor_parallel_activations(x):
    """Korthikanti eq. (2): sbh(10 + 24/t + 5as/(ht)); the 10 sbh outside the TP region stays."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    assert act(gpt_spec(s, a, x["head_dim"]), b, t) == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)


@given(shapes)
def test_tensor_and_sequence_parallel_activations(x):
    """Korthikanti eq. (4): sbh/t (34 + 5as/h): sequence parallelism splits the other 10 sbh."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    got = act(gpt_spec(s, a, x["head_dim"]), b, t, sequence_parallel=True)
    assert got == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-12)


@given(shapes)
def test_selective_recompute_with_sequence_parallel_keeps_34_sbh_over_t(x):
    """Korthikanti eq. (5): dropping softmax, its mask and dropout output leaves 34 sbh/t."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    got = act(gpt_spec(s, a, x["head_dim"]), b, t, sequence_parallel=True, recompute="selective")
    assert got == pytest.approx(34 * s * b * h / t, rel=1e-12)


@given(shapes)
def test_full_recompute_keeps_only_the_layer_input(x):
    """Korthikanti sec. 4.1: full recomputation stores 2sbh/t with sequence parallelism, 2sbh
    without."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    m = gpt_spec(s, a, x["head_dim"])
    assert act(m, b, t, sequence_parallel=True, recompute="full") == pytest.approx(
        2 * s * b * h / t, rel=1e-12)
    assert act(m, b, t, recompute="full") == pytest.approx(2 * s * b * h, rel=1e-12)


@given(shapes)
def test_flash_attention_removes_the_s_squared_term(x):
    """Flash attention keeps no a x s x s scores, only an fp32 log-sum-exp per row and head:
    34 sbh/t + 4as b/t with sequence parallelism, linear in s."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    flash = act(gpt_spec(s, a, x["head_dim"]), b, t, sequence_parallel=True,
                flash_attention=True)
    assert flash == pytest.approx(34 * s * b * h / t + 4 * a * s * b / t, rel=1e-12)
    doubled = act(gpt_spec(2 * s, a, x["head_dim"]), b, t, sequence_parallel=True,
                  flash_attention=True)
    assert doubled == pytest.approx(2 * flash, rel=1e-12)


def test_grouped_query_attention_shrinks_only_k_and_v():
    """With h_kv = kv_heads * head_dim, K and V keep 4 s b h_kv / t instead of 4 s b h / t."""
    s, b, h, a, t = 1024, 2, 2048, 16, 4
    mha = ModelSpec(**gpt(hidden=h, heads=a, seq_len=s))
    gqa = ModelSpec(**gpt(hidden=h, heads=a, kv_heads=4, seq_len=s))
    h_kv = 4 * h // a
    assert act(mha, b, t) - act(gqa, b, t) == pytest.approx(4 * s * b * (h - h_kv) / t)


def test_swiglu_keeps_three_ffn_wide_tensors():
    """SwiGLU keeps gate, up and their product (3 x 2 s b f / t), GELU its input and output
    (2 x 2 s b f / t); everything else is the same."""
    s, b, h, t, f = 512, 1, 1024, 2, 2816
    gelu = ModelSpec(**gpt(hidden=h, heads=8, seq_len=s, ffn_hidden=f))
    swiglu = ModelSpec(**gpt(hidden=h, heads=8, seq_len=s, ffn_hidden=f, ffn_kind="swiglu"))
    assert act(swiglu, b, t) - act(gelu, b, t) == pytest.approx(2 * s * b * f / t)


@given(shapes)
def test_fp32_activations_double_the_tensors_but_not_the_masks(x):
    """With e-byte tensors and 1-byte masks eq. (1)'s 34 = 16e + 2 and 5 = 2e + 1; fp32 (e = 4)
    gives sbh(66 + 9as/h)."""
    s, b, a = x["s"], x["b"], x["a"]
    h = a * x["head_dim"]
    got = act(gpt_spec(s, a, x["head_dim"]), b, precision="fp32")
    assert got == pytest.approx(s * b * h * (66 + 9 * a * s / h), rel=1e-12)


@given(shapes)
def test_autocast_keeps_the_residual_stream_in_fp32(x):
    """Under autocast over fp32 parameters the two norms' inputs (the residual stream) are fp32:
    eq. (2)'s 10 sbh outside the TP region becomes 14 (4 of the norms' inputs grow from 2e to
    2 x 4), the GEMMs' saved inputs stay bf16; full recomputation keeps a 4-byte input."""
    s, b, a, t = x["s"], x["b"], x["a"], x["t"]
    h = a * x["head_dim"]
    if a % t:
        return
    m = gpt_spec(s, a, x["head_dim"])
    assert act(m, b, t, autocast=True) - act(m, b, t) == pytest.approx(4 * s * b * h, rel=1e-12)
    assert act(m, b, t, recompute="full", autocast=True) == pytest.approx(4 * s * b * h,
                                                                          rel=1e-12)


def test_autocast_loss_keeps_its_logits_twice():
    """The output layer and loss: an fp32 final-norm input, the output layer's bf16 input, and
    the logits in bf16 (the GEMM's output, cross-entropy's saved input) and fp32."""
    from clustersim.simulator.model.activations import head_bytes
    m = gpt_spec(2048, 16, 128)
    tokens, h, v = 4096, 2048, m.vocab
    assert head_bytes(m, tokens, 2, 1, "bf16") == pytest.approx(
        4 * tokens * h + 4 * tokens * v / 2, rel=1e-12)
    assert head_bytes(m, tokens, 2, 1, "bf16", autocast=True) == pytest.approx(
        6 * tokens * h + 6 * tokens * v / 2, rel=1e-12)


def test_autocast_needs_a_precision_to_cast_to():
    from clustersim.errors import ScenarioError
    with pytest.raises(ScenarioError, match="training.autocast"):
        scenario(gpt(), gpus=1, training={"precision": "fp32", "autocast": True})
