"""Scenario loading: presets with overrides, derived dp, --set, and the cross-section rules."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import apply_overrides, build_scenario, load_scenario
from clustersim.simulator.pipeline.stages import chunk_layers, even_split, stage_layers

BASE = {
    "model": {"preset": "gpt-18.4b"},
    "cluster": {"preset": "dgx-a100-80gb", "gpus": 256},
    "training": {"global_batch": 1024},
    "parallel": {"tp": 8},
}


def scenario(**sections):
    raw = {k: dict(v) for k, v in BASE.items()}
    for section, fields in sections.items():
        raw[section] = {**raw.get(section, {}), **fields}
    return build_scenario(raw)


def error_of(**sections) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        scenario(**sections)
    return info.value


def test_dp_is_derived_from_the_gpu_count():
    s = scenario(parallel={"tp": 8, "pp": 2})
    assert s.parallel.dp == 256 // (8 * 2)
    assert s.microbatches == 1024 // (16 * 1)


def test_preset_fields_can_be_overridden():
    s = scenario(model={"preset": "gpt-18.4b", "layers": 20, "seq_len": 4096})
    assert (s.model.layers, s.model.seq_len, s.model.hidden) == (20, 4096, 6144)
    assert s.model.name == "gpt-18.4b"


def test_defaults_follow_the_scenario_contract():
    s = build_scenario({"model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100,
                                  "seq_len": 32},
                        "cluster": {"preset": "dgx-h100", "gpus": 8},
                        "training": {"global_batch": 8}})
    assert s.model.kv_heads == 4 and s.model.ffn_hidden == 256 and s.model.ffn_kind == "gelu"
    assert (s.parallel.tp, s.parallel.pp, s.parallel.dp, s.parallel.cp) == (1, 1, 8, 1)
    assert s.parallel.schedule == "1f1b" and s.parallel.zero == 0
    assert s.training.precision == "bf16" and s.training.micro_batch == 1


def test_cluster_by_nodes_and_gpu_override():
    raw = {**BASE, "cluster": {"preset": "dgx-h100", "nodes": 32, "gpu": "h200"}}
    s = build_scenario(raw)
    assert s.cluster.gpus == 256 and s.cluster.gpu.id == "h200"
    assert s.cluster.inter_node.bandwidth == 50


def test_link_tier_overrides_merge_into_the_preset():
    s = scenario(cluster={"preset": "dgx-a100-80gb", "gpus": 256,
                          "inter_node": {"bandwidth": 12.5}})
    assert s.cluster.inter_node.bandwidth == 12.5
    assert s.cluster.inter_node.latency == 5.0e-6  # kept from the preset


def test_tokens_accepts_unsigned_exponents(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: {preset: gpt-1.7b}\ncluster: {preset: dgx-a100-80gb, gpus: 32}\n"
                    "training: {global_batch: 512, tokens: 3.0e11}\n")
    assert load_scenario(path).training.tokens == 3e11


def test_set_overrides_go_through_validation(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: {preset: gpt-1.7b}\ncluster: {preset: dgx-a100-80gb, gpus: 32}\n"
                    "training: {global_batch: 512}\n")
    s = load_scenario(path, ["parallel.tp=2", "training.micro_batch=2", "name=probe"])
    assert (s.parallel.tp, s.parallel.dp, s.training.micro_batch, s.name) == (2, 16, 2, "probe")
    with pytest.raises(ScenarioError, match="parallel.tp"):
        load_scenario(path, ["parallel.tp=5"])


def test_set_needs_path_and_value():
    with pytest.raises(ScenarioError, match="dotted.path=value"):
        apply_overrides({}, ["parallel.tp"])
    with pytest.raises(ScenarioError, match="model.layers: is not a section"):
        apply_overrides({"model": {"layers": 4}}, ["model.layers.x=1"])


def test_as_dict_round_trips():
    s = scenario(parallel={"tp": 8, "pp": 2, "schedule": "interleaved", "virtual_stages": 2})
    assert build_scenario(s.as_dict()) == s


@pytest.mark.parametrize("sections, field", [
    ({"parallel": {"tp": 5}}, "parallel.tp"),  # 5 does not divide 48 heads
    ({"model": {"preset": "gpt-18.4b", "kv_heads": 12}}, "parallel.tp"),  # 12 vs tp 8
    ({"parallel": {"tp": 8, "dp": 16}}, "parallel.dp"),  # 8*16 != 256
    ({"parallel": {"tp": 3}}, "parallel"),  # divides the heads, but 3 does not divide 256 GPUs
    ({"training": {"global_batch": 1000}}, "training.global_batch"),  # 1000 % 32
    ({"parallel": {"tp": 4, "pp": 64, "dp": 1}}, "parallel.pp"),  # 40 layers < 64 stages
    ({"parallel": {"tp": 8, "pp": 2, "stage_layers": [20, 19]}}, "parallel.stage_layers"),
    ({"parallel": {"tp": 8, "pp": 2, "stage_layers": [10, 10, 20]}}, "parallel.stage_layers"),
    ({"parallel": {"tp": 8, "virtual_stages": 2}}, "parallel"),
    ({"model": {"preset": "nope"}}, "model.preset"),
    ({"cluster": {"preset": "dgx-z"}}, "cluster.preset"),
    ({"cluster": {"preset": "dgx-h100", "gpus": 256, "gpu": "tpu"}}, "cluster.gpu.preset"),
    ({"model": {"preset": "gpt-18.4b", "layers": -2}}, "model.layers"),
    ({"training": {"global_batch": "lots"}}, "training.global_batch"),
    ({"parallel": {"tp": 8, "tpp": 2}}, "parallel.tpp"),
    ({"parallel": {"tp": True}}, "parallel.tp"),
    ({"parallel": {"tp": 8, "zero": 4}}, "parallel.zero"),
    ({"parallel": {"tp": 8, "cp": 3}}, "parallel.cp"),  # 2048 tokens not in 2*cp chunks
    ({"parallel": {"tp": 8, "pp": 3}}, "parallel"),  # 24 does not divide 256
    ({"parallel": {"tp": 8, "ep": 2}}, "parallel.ep"),  # a dense model has no experts
    ({"model": {"preset": "mixtral-8x7b"}, "parallel": {"tp": 8}},
     "parallel.sequence_parallel"),  # MoE with tp > 1 needs it (Megatron-LM)
    ({"model": {"preset": "llama3-70b"}, "parallel": {"tp": 8, "cp": 2, "cp_comm": "a2a"}},
     "parallel.cp_comm"),  # one K/V head per TP rank cannot split over two CP ranks
    ({"model": {"preset": "deepseek-v3"}, "parallel": {"tp": 1, "cp": 2, "cp_comm": "allgather"}},
     "parallel.cp_comm"),  # MLA runs the p2p ring only
    ({"parallel": {"cp": 2, "cp_comm": "ring"}}, "parallel.cp_comm"),  # p2p, allgather or a2a
    ({"model": {"preset": "llama3-8b", "kv_heads": 4}, "parallel": {
        "tp": 1, "cp": 16, "cp_comm": "a2a+p2p"}}, "parallel.cp_comm"),  # 4 over a node's 8
    ({"model": {"preset": "mixtral-8x7b", "capacity_factor": 0}}, "model.capacity_factor"),
    ({"model": {"preset": "mixtral-8x7b", "expert_imbalance": 0.5}}, "model.expert_imbalance"),
    ({"parallel": {"tp": 8, "pp": 4, "schedule": "interleaved", "virtual_stages": 2},
      "training": {"global_batch": 24}}, "training.global_batch"),  # 3 micro-batches, pp 4
])
def test_impossible_scenarios_name_the_field(sections, field):
    err = error_of(**sections)
    assert err.field == field, str(err)


def test_kv_heads_fewer_than_tp_are_replicated_not_refused():
    s = scenario(model={"preset": "llama2-70b"}, parallel={"tp": 16})  # 64 heads, 8 kv heads
    assert s.parallel.tp == 16
    # Each rank keeps one whole K/V head (128 wide) rather than half of one.
    assert s.model.kv_width_per_rank(16) == s.model.kv_width_per_rank(8) == 128
    assert s.model.kv_width_per_rank(2) == 4 * 128


def test_llama3_405b_on_16_stages_spreads_126_layers_with_the_remainder_first():
    s = build_scenario({"model": {"preset": "llama3-405b"},
                        "cluster": {"preset": "dgx-h100", "gpus": 8192},
                        "training": {"global_batch": 2048},
                        "parallel": {"tp": 8, "pp": 16, "dp": 64}})
    layers = stage_layers(s)
    assert sum(layers) == 126 and max(layers) - min(layers) == 1
    assert layers == sorted(layers, reverse=True)


def test_stage_layers_per_stage_or_per_chunk():
    per_stage = scenario(parallel={"tp": 8, "pp": 2, "schedule": "interleaved",
                                   "virtual_stages": 2, "stage_layers": [22, 18]})
    assert stage_layers(per_stage) == [22, 18]
    assert chunk_layers(per_stage) == [11, 9, 11, 9]  # chunk c runs on stage c % pp
    per_chunk = scenario(parallel={"tp": 8, "pp": 2, "schedule": "interleaved",
                                   "virtual_stages": 2, "stage_layers": [9, 11, 10, 10]})
    assert stage_layers(per_chunk) == [19, 21]


def test_the_end_chunks_may_hold_the_embedding_or_the_head_alone():
    """Megatron-Core's --account-for-embedding-in-pipeline-split / -loss-: a per-chunk count
    of 0 for the model's first or last chunk; nowhere else, and no stage left empty."""
    ends = scenario(parallel={"tp": 8, "pp": 2, "schedule": "interleaved",
                              "virtual_stages": 4, "stage_layers": [0, 6, 6, 6, 6, 6, 10, 0]})
    assert chunk_layers(ends) == [0, 6, 6, 6, 6, 6, 10, 0]
    assert stage_layers(ends) == [22, 18]  # chunk c runs on stage c % pp
    for layers, words in (([6, 0, 6, 6, 6, 6, 10, 0], "first and last chunks"),
                          ([0, 40], "first and last chunks")):  # per stage, 4 chunks each
        with pytest.raises(ScenarioError, match=words) as caught:
            scenario(parallel={"tp": 8, "pp": 2, "schedule": "interleaved",
                               "virtual_stages": 4, "stage_layers": layers})
        assert caught.value.field == "parallel.stage_layers"
    with pytest.raises(ScenarioError, match="without layers") as caught:
        scenario(parallel={"tp": 8, "pp": 4, "stage_layers": [0, 20, 20, 0]})
    assert caught.value.field == "parallel.stage_layers"


@pytest.mark.parametrize("total, parts", [(126, 16), (40, 3), (7, 7), (96, 8)])
def test_even_split_differs_by_at_most_one(total, parts):
    split = even_split(total, parts)
    assert sum(split) == total and len(split) == parts and max(split) - min(split) <= 1
