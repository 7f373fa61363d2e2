"""DeepSeekMoE's shared experts and dense first layers (``model.shared_experts``,
``model.dense_layers``): parameters, FLOPs, stage layout, step time, memory and traffic.

Oracles: hand counts of the layer layouts, the identity that shared experts cost what as many
more routed experts per token cost, and composition: a model whose first k layers are dense
costs what a k-layer dense model and an (L-k)-layer MoE model cost together, less one copy of
what both count once (embedding, output layer), measured on uniform models only."""

from __future__ import annotations

import pytest
from sim_helpers import FAST_HBM, FREE, flat_profile

from clustersim.errors import ScenarioError
from clustersim.simulator.closed_form.analytic import CostModel, estimate, stage_times
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import traffic
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.stages import chunk_mix, stage_mix

LLAMA_LIKE = {"norm": "rmsnorm", "bias": False, "position_embedding": "rope",
              "tie_embeddings": False, "ffn_kind": "swiglu"}
MOE = {"hidden": 512, "heads": 8, "ffn_hidden": 256, "vocab": 64, "seq_len": 256,
       "experts": 8, "top_k": 2, "capacity_factor": None, **LLAMA_LIKE}


def scenario(model: dict, pp=1, dp=1, ep=1, micro_batches=4, schedule="1f1b", v=1,
             free_links=False):
    cluster = {"preset": "dgx-h100", "gpus": pp * dp, "gpu": FAST_HBM}
    if free_links:
        cluster.update(intra_node=FREE, inter_node=FREE)
    return build_scenario({
        "model": model, "cluster": cluster,
        "training": {"global_batch": micro_batches * dp},
        "parallel": {"pp": pp, "dp": dp, "ep": ep, "schedule": schedule,
                     "virtual_stages": v}})


def dense_only(layers: int) -> dict:
    """The dense first layers as a model of their own: MOE's attention, one 1024-wide MLP."""
    return {**{k: v for k, v in MOE.items() if k not in ("experts", "top_k", "capacity_factor")},
            "layers": layers, "ffn_hidden": 1024}


def mixed(layers: int, dense: int, **kw) -> dict:
    return {**MOE, "layers": layers, "dense_layers": dense, "dense_ffn_hidden": 1024, **kw}


def test_shared_experts_add_one_mlp_of_their_width_and_the_router_is_h_by_experts():
    m = build_scenario({"model": {**MOE, "layers": 2, "shared_experts": 2},
                        "cluster": {"preset": "dgx-h100", "gpus": 1},
                        "training": {"global_batch": 1}}).model
    h, f = 512, 256
    assert pc.mlp_params(m) == 8 * 3 * h * f + 3 * h * (2 * f) + h * 8


def test_a_shared_expert_of_its_own_width_is_explicit():
    base = {**MOE, "layers": 2, "shared_experts": 1}
    narrow = scenario({**base, "shared_ffn_hidden": 128}).model
    assert pc.mlp_params(narrow) == 8 * 3 * 512 * 256 + 3 * 512 * 128 + 512 * 8


def test_shared_experts_cost_the_flops_of_as_many_more_routed_experts_per_token():
    with_shared = scenario({**MOE, "layers": 4, "shared_experts": 2})
    routed_only = scenario({**MOE, "layers": 4, "top_k": 4})
    assert wl.model_flops_per_step(with_shared) == wl.model_flops_per_step(routed_only)
    # and they run on every token of the rank, as dense GEMMs beside the experts'
    shared = wl.layer_kernels(with_shared).gemms[-3:]
    assert [(g.m, g.n, g.k) for g in shared] == [(256, 512, 512)] * 2 + [(256, 512, 512)]


def test_first_layers_dense_compose_parameters_and_flops_of_the_two_models():
    L, k = 6, 2
    s_mixed = scenario(mixed(L, k))
    s_dense, s_moe = scenario(dense_only(k)), scenario({**MOE, "layers": L - k})
    shared = pc.embedding_params(s_mixed.model) + pc.head_params(s_mixed.model)
    assert pc.total_params(s_mixed.model) == (pc.total_params(s_dense.model)
                                              + pc.total_params(s_moe.model) - shared)
    logits = 3 * wl.logits_forward_flops(s_mixed.model) * s_mixed.training.global_batch
    assert wl.model_flops_per_step(s_mixed) == pytest.approx(
        wl.model_flops_per_step(s_dense) + wl.model_flops_per_step(s_moe) - logits, rel=1e-12)


def test_dense_layers_are_the_first_ones_on_the_first_chunks():
    # 61 layers on 16 stages (DeepSeek-V3's pp): 13 stages of 4 and 3 of 3; the 3 dense first
    s = scenario({"preset": "deepseek-v3", "seq_len": 4096}, pp=16, dp=8, ep=8)
    assert stage_mix(s)[0] == (3, 1) and all(d == 0 for d, _ in stage_mix(s)[1:])
    # in a V (zb-v: 32 chunks, chunk 1 on stage 1) the third dense layer is stage 1's
    s = scenario({"preset": "deepseek-v3", "seq_len": 4096}, pp=16, dp=8, ep=8,
                 schedule="zb-v", v=2, micro_batches=32)
    assert chunk_mix(s)[:3] == [(2, 0), (1, 1), (0, 2)]
    # stage 0 also runs the last chunk (one MoE layer and the MTP module's), stage 1 the one
    # before it
    assert stage_mix(s)[:2] == [(2, 2), (1, 2)]


def compute(model: dict) -> float:
    """Compute seconds of one step (one stage, free links): m x (layers + output layer)."""
    return estimate(scenario(model, free_links=True), flat_profile(0.5)).breakdown.compute


def test_step_compute_composes_from_uniform_models():
    # C(L layers) = m (sum of layer times + H): C(mixed) = C(dense k) + C(moe L-k) - m H, and
    # m H = 2 C(moe 1 layer) - C(moe 2 layers)
    L, k = 6, 2
    head = 2 * compute({**MOE, "layers": 1}) - compute({**MOE, "layers": 2})
    expected = compute(dense_only(k)) + compute({**MOE, "layers": L - k}) - head
    assert compute(mixed(L, k)) == pytest.approx(expected, rel=1e-9)


def test_the_engine_agrees_with_the_closed_form_on_one_mixed_stage():
    s = scenario(mixed(8, 3), micro_batches=8, free_links=True)
    profile = flat_profile(0.5)
    assert simulate(s, profile=profile).step_time_s == pytest.approx(
        estimate(s, profile).step_time_s, rel=1e-6)


def test_the_engines_chunks_cost_what_the_closed_forms_stages_do():
    s = scenario(mixed(8, 3), pp=2, micro_batches=8, free_links=True)
    cm = CostModel(s, flat_profile(0.5))
    for stage, chunk in enumerate(cm.chunks):
        closed = stage_times(cm, stage)
        assert (chunk.forward, chunk.backward) == pytest.approx((closed.forward,
                                                                 closed.backward), rel=1e-12)


def test_every_parameter_sits_on_exactly_one_stage():
    s = scenario(mixed(8, 3), pp=4)
    on_stages = sum(sum(mem.stage_params_per_rank(s, i)) for i in range(4))
    assert on_stages == pc.total_params(s.model)


def test_dense_first_layers_send_no_expert_all_to_alls():
    L, k = 6, 2
    got = traffic.traffic_bytes(scenario(mixed(L, k), dp=4, ep=4))["ep"]
    assert got == traffic.traffic_bytes(scenario({**MOE, "layers": L - k}, dp=4, ep=4))["ep"]
    assert got > 0


def test_stage_activations_count_each_kind_of_layer():
    # one stage under 1F1B holds one micro-batch: each layer's bytes once, plus the head's
    s = scenario(mixed(6, 2))
    dense, moe = scenario(dense_only(2)), scenario({**MOE, "layers": 4})
    per_dense, per_moe = (mem.scenario_layer_bytes(x, "none") for x in (dense, moe))
    assert per_dense != per_moe
    head = mem.stage_activation_bytes(moe, 0) - 4 * per_moe
    assert mem.stage_activation_bytes(s, 0) == pytest.approx(
        2 * per_dense + 4 * per_moe + head, rel=1e-12)


@pytest.mark.parametrize("change, message", [
    ({"experts": 1, "top_k": 1, "shared_experts": 1}, "shared_experts sit beside routed"),
    ({"dense_layers": 2}, "dense_layers needs dense_ffn_hidden"),
    ({"dense_layers": 6, "dense_ffn_hidden": 1024}, "dense_layers (6) must be fewer than"),
    ({"dense_ffn_hidden": 1024}, "dense_ffn_hidden is given but dense_layers is 0"),
    ({"shared_ffn_hidden": 128}, "shared_ffn_hidden is given but shared_experts is 0"),
])
def test_inconsistent_deepseek_moe_fields_are_bad_input(change, message):
    with pytest.raises(ScenarioError, match=r"^model: " + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        scenario({**MOE, "layers": 6, **change})


def test_tp_must_divide_the_dense_layers_width():
    with pytest.raises(ScenarioError, match="parallel.tp: tp = 2 must divide "
                                            "model.dense_ffn_hidden = 1001"):
        build_scenario({"model": mixed(6, 2, dense_ffn_hidden=1001),
                        "cluster": {"preset": "dgx-h100", "gpus": 2},
                        "training": {"global_batch": 2},
                        "parallel": {"tp": 2, "sequence_parallel": True}})
