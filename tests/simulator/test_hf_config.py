"""``model: {hf_config: config.json}``: Hugging Face transformers configs as model specs (issue 12,
item 9). Oracles: the shipped presets, written from the papers, and the published sizes."""

import json
import shutil
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.hf_config import model_fields
from clustersim.simulator.inputs.scenario import build_scenario, load_scenario
from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model.param_counts import activated_params, embedding_params, total_params

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
CLUSTER = {"preset": "dgx-h100", "nodes": 1}


def scenario_with(model: dict, tp: int = 1):
    return build_scenario({"model": model, "cluster": CLUSTER,
                           "training": {"global_batch": 64}, "parallel": {"tp": tp}})


def config(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


@pytest.mark.parametrize("fixture, preset", [("llama3-8b", "llama3-8b"),
                                             ("mixtral-8x7b", "mixtral-8x7b"),
                                             ("deepseek-moe-16b", "deepseek-moe-16b"),
                                             ("deepseek-v2-lite", "deepseek-v2-lite"),
                                             ("deepseek-v3", "deepseek-v3"),
                                             ("qwen3-30b-a3b", "qwen3-30b-a3b"),
                                             ("qwen3-235b-a22b", "qwen3-235b-a22b"),
                                             ("qwen3-32b", "qwen3-32b")])
def test_import_equals_the_preset_written_from_the_paper(fixture, preset):
    imported = scenario_with({"hf_config": str(HF / f"{fixture}.json")}).model
    shipped = scenario_with({"preset": preset}).model
    assert total_params(imported) == total_params(shipped)
    assert imported.model_dump() == shipped.model_dump()


def test_qwen2_7b_has_its_published_size():
    # Qwen2 technical report / model card: 7.62B; the spec leaves out q/k/v biases (0.13M)
    model = scenario_with({"hf_config": str(HF / "qwen2-7b.json")}, tp=4).model
    assert total_params(model) == pytest.approx(7.62e9, rel=0.002)
    assert (model.kv_heads, model.ffn_kind, model.norm, model.bias) == (4, "swiglu", "rmsnorm",
                                                                         False)


@pytest.mark.parametrize("fixture, total, active", [("qwen3-30b-a3b", 30.5e9, 3.3e9),
                                                    ("qwen3-235b-a22b", 235e9, 22e9)])
def test_qwen3_moe_keeps_its_128_wide_heads_and_has_its_published_sizes(fixture, total, active):
    # Qwen3 model cards: 30.5B total and 3.3B activated, 235B and 22B; Qwen counts the embedding
    # table as activated, which activated_params (the 6N FLOPs' N) leaves out. The cards
    # truncate: 3.35B counted gives "3.3B", 22.19B "22B".
    model = scenario_with({"hf_config": str(HF / f"{fixture}.json")}).model
    assert model.head_dim == 128 and model.query_width == 128 * model.heads != model.hidden
    assert total_params(model) == pytest.approx(total, rel=0.002)
    assert activated_params(model) + embedding_params(model) == pytest.approx(active, rel=0.02)


def test_qwen3_32b_has_its_published_size_with_heads_wider_than_hidden():
    # Qwen/Qwen3-32B model card: 32.8B parameters, 31.2B non-embedding; 64 heads of 128 make
    # 8,192 query columns over a hidden size of 5,120
    model = scenario_with({"hf_config": str(HF / "qwen3-32b.json")}).model
    assert model.query_width == 8192 and model.hidden == 5120
    assert total_params(model) == pytest.approx(32.8e9, rel=0.002)
    assert total_params(model) - embedding_params(model) - model.vocab * model.hidden == \
        pytest.approx(31.2e9, rel=0.002)


def test_qwen_gated_shared_expert_is_refused_naming_the_field():
    # Qwen2-MoE gates its shared expert with a sigmoid of its own (modeling_qwen2_moe.py
    # shared_expert_gate): not DeepSeek's always-on shared experts, so not imported as them.
    field = "shared_expert_intermediate_size"
    with pytest.raises(ScenarioError, match=f"model.hf_config: {field} = .*cannot be represented"):
        scenario_with({"hf_config": str(HF / "qwen1.5-moe-a2.7b.json")})


def test_deepseek_v3_config_maps_shared_experts_dense_layers_and_latent_attention():
    # deepseek-ai/DeepSeek-V3 config.json: n_shared_experts 1, first_k_dense_replace 3 with
    # intermediate_size 18432, q_lora_rank 1536, kv_lora_rank 512, head dims 128/64/128
    f = model_fields(config("deepseek-v3"))
    assert (f["shared_experts"], f["dense_layers"], f["dense_ffn_hidden"]) == (1, 3, 18432)
    assert (f["q_lora_rank"], f["kv_lora_rank"], f["qk_nope_head_dim"], f["qk_rope_head_dim"],
            f["v_head_dim"]) == (1536, 512, 128, 64, 128)
    assert (f["experts"], f["top_k"], f["ffn_hidden"]) == (256, 8, 2048)


def test_deepseek_v2_lite_has_no_query_latent():
    # DeepSeek-V2 report Appendix B: V2-Lite "does not compress the queries"
    f = model_fields(config("deepseek-v2-lite"))
    assert f["q_lora_rank"] is None and f["kv_lora_rank"] == 512


def test_deepseek_moe_16b_imports_its_shared_experts_and_dense_first_layer():
    # DeepSeekMoE 16B (Dai et al. 2024 sec. 5.1.1): 2 shared + 64 routed experts of 1408, the
    # first layer dense (intermediate_size 10944); 16.4B parameters
    model = scenario_with({"hf_config": str(HF / "deepseek-moe-16b.json")}).model
    assert (model.shared_experts, model.dense_layers, model.dense_ffn_hidden) == (2, 1, 10944)
    assert total_params(model) == pytest.approx(16.4e9, abs=0.05e9)


@pytest.mark.parametrize("key, value", [("n_shared_experts", 2), ("first_k_dense_replace", 1),
                                        ("q_lora_rank", 1536)])
def test_deepseek_fields_on_another_model_type_are_refused(key, value):
    with pytest.raises(ScenarioError, match=f"model.hf_config: {key} = {value}: .*outside "
                                            "DeepSeek's model types"):
        model_fields({**config("llama3-8b"), key: value})


@pytest.mark.parametrize("fixture, removed, experts, top_k, width", [
    ("deepseek-moe-16b", {"n_shared_experts": 0, "first_k_dense_replace": 0}, 64, 6, 1408),
    ("qwen1.5-moe-a2.7b", {"shared_expert_intermediate_size": 0}, 60, 4, 1408),
])
def test_routed_expert_fields_map_to_the_spec(fixture, removed, experts, top_k, width):
    spec = ModelSpec.model_validate(model_fields({**config(fixture), **removed}))
    assert (spec.experts, spec.top_k, spec.ffn_hidden) == (experts, top_k, width)
    # every layer: attention 4h^2 (MHA), E experts of 3*h*f, the h x E router (transformers'
    # `gate = nn.Linear(hidden_size, num_experts, bias=False)`), two RMSNorms; untied head
    h, f, layers = spec.hidden, width, spec.layers
    per_layer = 4 * h * h + experts * 3 * h * f + h * experts + 2 * h
    assert total_params(spec) == layers * per_layer + 2 * spec.vocab * h + h


def test_scenario_fields_override_the_import_and_paths_are_relative_to_the_file(tmp_path):
    (tmp_path / "models" / "llama").mkdir(parents=True)
    shutil.copy(HF / "llama3-8b.json", tmp_path / "models" / "llama" / "config.json")
    (tmp_path / "s.yaml").write_text(
        "model: {hf_config: models/llama/config.json, seq_len: 4096}\n"
        "cluster: {preset: dgx-h100, nodes: 1}\ntraining: {global_batch: 8}\n")
    model = load_scenario(tmp_path / "s.yaml").model
    assert (model.name, model.seq_len, model.layers) == ("llama", 4096, 32)


def test_sliding_window_shorter_than_seq_len_is_refused_until_seq_len_fits(tmp_path):
    # Mistral 7B v0.1's 4096-token window (mistralai/Mistral-7B-v0.1 config.json)
    path = tmp_path / "mistral.json"
    path.write_text(json.dumps({**config("llama3-8b"), "model_type": "mistral",
                                "sliding_window": 4096}))
    with pytest.raises(ScenarioError, match="sliding_window = 4096: windowed attention"):
        scenario_with({"hf_config": str(path)})
    assert scenario_with({"hf_config": str(path), "seq_len": 4096}).model.seq_len == 4096


@pytest.mark.parametrize("content, why", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ('{"model_type": "gpt2", "n_layer": 12}', "unsupported architecture 'gpt2'"),
    ('{"model_type": "llama"}', "the config has no 'num_attention_heads'"),
])
def test_bad_config_is_one_error_line_and_status_2(tmp_path, capsys, content, why):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    (tmp_path / "s.yaml").write_text(
        "model: {hf_config: config.json}\ncluster: {preset: dgx-h100, nodes: 1}\n"
        "training: {global_batch: 8}\n")
    assert main(["simulate", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.hf_config: ") and why in err[0]


def test_preset_and_hf_config_together_are_refused():
    with pytest.raises(ScenarioError, match="model.hf_config: give model.preset or"):
        scenario_with({"preset": "llama3-8b", "hf_config": str(HF / "llama3-8b.json")})


@pytest.mark.parametrize("change, field", [
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act = 'gelu_pytorch_tanh'"),
    ({"attention_bias": True}, "attention_bias = True"),  # mlp_bias stays false
    ({"kv_lora_rank": 512}, "kv_lora_rank = 512"),  # DeepSeek-V2's latent attention
])
def test_what_the_spec_cannot_represent_is_refused(change, field):
    with pytest.raises(ScenarioError, match=f"model.hf_config: {field}: .*cannot be represented"):
        model_fields({**config("llama3-8b"), **change})


def test_an_explicit_head_dim_equal_to_hidden_over_heads_is_accepted():
    assert model_fields({**config("llama3-8b"), "head_dim": 128})["hidden"] == 4096
    assert "head_dim" not in model_fields({**config("llama3-8b"), "head_dim": 128})


def test_another_head_width_is_imported_as_head_dim():
    # Mistral NeMo's style: 32 heads of 128 over a hidden size of 5120
    assert model_fields({**config("llama3-8b"), "hidden_size": 5120, "head_dim": 128})[
        "head_dim"] == 128
