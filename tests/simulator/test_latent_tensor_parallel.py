"""Multi-head latent attention under tensor parallelism (simulator/model/latent.py), as
Megatron-Core runs it with sequence parallelism: per-head up-projections split by columns, the
output projection by rows, the down-projections whole on every rank over its sequence shard,
the latents gathered instead of the hidden state, and the whole weights' gradients summed over
the TP group once a step. Oracles: DeepSeek-V3's layer counted by hand, and the TP group
together doing exactly the one-rank layer's work."""

from __future__ import annotations

from collections import Counter

import pytest

from clustersim.simulator.costs import layer_comm
from clustersim.simulator.costs.cost_model import tp_grad_sum_bytes
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import activations, latent
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl

V3_ATTENTION = {"heads": 128, "kv_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
DENSE_V3 = {"layers": 4, "hidden": 7168, "ffn_hidden": 18432, "vocab": 1000, "seq_len": 4096,
            "norm": "rmsnorm", "bias": False, "position_embedding": "rope",
            "tie_embeddings": False, "ffn_kind": "swiglu", **V3_ATTENTION}
TOKENS = 4096


def scenario(tp: int = 1, precision: str = "bf16", **parallel):
    return build_scenario({"model": DENSE_V3, "cluster": {"preset": "dgx-h100", "gpus": tp},
                           "training": {"global_batch": 1, "precision": precision},
                           "parallel": {"tp": tp, "sequence_parallel": tp > 1, **parallel}})


def test_every_rank_holds_the_down_projections_and_latent_norms_whole():
    m = build_scenario({"model": DENSE_V3, "cluster": {"preset": "dgx-h100", "gpus": 1},
                        "training": {"global_batch": 1}}).model
    # q_a_proj 7168 x 1536, kv_a_proj_with_mqa 7168 x (512 + 64), the two latent RMSNorms
    whole = 7168 * 1536 + 7168 * 576 + 1536 + 512
    assert latent.duplicated_params(m) == whole
    # q_b_proj 1536 x 128*192, kv_b_proj 512 x 128*256 and o_proj 128*128 x 7168 split 8 ways
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    dense, _ = pc.layer_params_per_rank(m, tp=8, ep=1)
    mlp_and_norms = 3 * 7168 * 18432 / 8 + 2 * 7168
    assert dense == pytest.approx(whole + split / 8 + mlp_and_norms, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_tp_group_together_runs_the_one_rank_layers_projection_flops(tp):
    one = sum(g.flops for g in latent.gemms(scenario().model, TOKENS))
    per_rank = latent.gemms(scenario(tp).model, TOKENS, tp, sequence_parallel=True)
    assert tp * sum(g.flops for g in per_rank) == pytest.approx(one, rel=1e-12)
    # the down-projections run whole on the rank's shard of the tokens, the others on all
    assert [g.m for g in per_rank] == [TOKENS / tp, TOKENS, TOKENS / tp, TOKENS, TOKENS]
    assert latent.roles(scenario(tp).model) == (
        "duplicated", "column", "duplicated", "column", "row")


def test_sequence_parallel_gathers_the_latents_not_the_hidden_state():
    """A collective a tensor, as Megatron-Core's MLASelfAttention runs them: each latent by
    its up-projection, the shared RoPE key by a gather of its own."""
    s = scenario(tp=2)
    # per token: query latent 1536, key-value latent 512, shared RoPE key 64, bf16
    query, kv, rope = wl.latent_gather_bytes(s)
    assert (query, kv, rope) == (TOKENS * 1536 * 2, TOKENS * 512 * 2, TOKENS * 64 * 2)
    x = wl.tp_collective_bytes(s)
    forward = Counter()
    for c in layer_comm.tp_collectives(s):
        forward[c.kind, c.nbytes] += c.forward
    # attention: latents and RoPE key gathered, output reduce-scattered; the dense MLP:
    # hidden both ways
    assert +forward == {("allgather", x): 1, ("allgather", query): 1, ("allgather", kv): 1,
                        ("allgather", rope): 1, ("reduce_scatter", x): 2}
    backward = sum(c.backward * c.nbytes for c in layer_comm.tp_collectives(s))
    # MLP: output gradient gathered, input gradient scattered, input gathered again (3 x);
    # attention: output gradient gathered, the latents' and RoPE key's gradients scattered,
    # the latents gathered again
    assert backward == 3 * x + x + 2 * (query + kv) + rope


def test_without_sequence_parallelism_every_rank_projects_all_tokens_down():
    s = scenario(tp=2, sequence_parallel=False)
    one = latent.gemms(scenario().model, TOKENS)
    per_rank = latent.gemms(s.model, TOKENS, 2, sequence_parallel=False)
    down = sum(g.flops for g, role in zip(one, latent.roles(s.model), strict=True)
               if role == "duplicated")
    assert 2 * sum(g.flops for g in per_rank) == pytest.approx(
        sum(g.flops for g in one) + down, rel=1e-12)
    # forward all-reduces the two row-parallel outputs; backward the dense MLP's input
    # gradient and, for the attention, the latents' (the up-projections' inputs)
    x, (query, kv, _) = wl.tp_collective_bytes(s), wl.latent_gather_bytes(s)
    kinds = {(c.kind, c.nbytes, c.forward, c.backward) for c in layer_comm.tp_collectives(s)}
    assert kinds == {("allreduce", x, 2, 1), ("allreduce", query, 0, 1),
                     ("allreduce", kv, 0, 1)}  # the up-projections' input gradients, apart
    # identical inputs, identical gradients: nothing to sum over the TP group
    assert tp_grad_sum_bytes(s, 0) == 0.0


def test_latents_are_kept_on_the_ranks_sequence_shard():
    kw = dict(micro_batch=1, flash_attention=True, precision="bf16")
    m = scenario().model
    one = activations.layer_tensors(m, tp=1, **kw)["latents"]
    two = activations.layer_tensors(m, tp=2, sequence_parallel=True, **kw)["latents"]
    assert one == TOKENS * (1536 + 512) * (2 + 2)
    assert two == one / 2


def test_the_whole_weights_gradients_are_summed_over_the_tp_group_once_a_step():
    s = scenario(tp=2)
    # 4 layers on the one stage: 2 RMSNorms of 7168 and the duplicated MLA weights, fp32 grads
    per_layer = 2 * 7168 + latent.duplicated_params(s.model)
    assert tp_grad_sum_bytes(s, 0) == 4 * per_layer * 4
    assert tp_grad_sum_bytes(scenario(tp=1), 0) == 0.0


def test_up_projection_recomputation_gathers_the_latents_once_more():
    plain = layer_comm.tp_collectives(scenario(tp=2))
    rerun = layer_comm.tp_collectives(scenario(
        tp=2, recompute="selective", recompute_modules=["core_attn", "mla_up_proj"]))
    query, kv, rope = wl.latent_gather_bytes(scenario(tp=2))

    def gathers(cs, nbytes):
        return sum(c.backward for c in cs if c.kind == "allgather" and c.nbytes == nbytes)
    assert [gathers(rerun, n) - gathers(plain, n) for n in (query, kv, rope)] == [1, 1, 0]


def test_both_estimators_and_both_fidelities_agree_on_a_latent_moe_model_under_tp():
    from clustersim.simulator.closed_form import analytic
    from clustersim.simulator.discrete_event.engine import simulate

    s = build_scenario({
        "model": {"preset": "deepseek-v2-lite", "seq_len": 4096, "layers": 8,
                  "capacity_factor": 1.0},
        "cluster": {"preset": "dgx-h100", "gpus": 16},
        "training": {"global_batch": 32},
        "parallel": {"tp": 2, "sequence_parallel": True, "pp": 2, "ep": 4}})
    representative = simulate(s).step_time_s
    assert analytic.estimate(s).step_time_s == pytest.approx(representative, rel=0.01)
    assert simulate(s, "full").step_time_s == pytest.approx(representative, rel=0.03)
    assert simulate(s).breakdown.exposed_comm > 0
