"""``model: {hf_config: config.json}``: a Hugging Face transformers config as a model spec.

Reads the fields transformers' ``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``,
``Qwen2Config``, ``Qwen2MoeConfig``, ``Qwen3Config``, ``Qwen3MoeConfig`` and DeepSeek's
``DeepseekConfig``, ``DeepseekV2Config`` and ``DeepseekV3Config`` share (field names from
transformers ``src/transformers/models/<model>/configuration_<model>.py`` and deepseek-ai's
``configuration_deepseek.py``) and maps them onto ModelSpec's fields; DeepSeek's shared experts
(``n_shared_experts``), dense first layers (``first_k_dense_replace``, ``intermediate_size``)
and latent attention (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``) map onto the spec's fields of the same meaning. Every
other layer of a ModelSpec has the same attention and the same MLP, with biases on all linear
layers or on none; a config that needs more than that (MoE in only some layers, a gated shared
expert, windowed attention ...) is refused with one ``model.hf_config`` error naming the field,
never imported approximately. A ``head_dim`` other than ``hidden / heads`` (Qwen3's 128 over
any hidden size) becomes the spec's ``head_dim``. Two documented approximations: Qwen2's
q/k/v projections carry biases in transformers whatever the config says
(``modeling_qwen2.py``), which the spec's all-or-nothing ``bias`` cannot say; they are left out
(0.002% of Qwen2-7B's parameters). Qwen3's RMSNorm of each query and key head before RoPE
(``q_norm``, ``k_norm`` in transformers' ``modeling_qwen3.py``) is left out: ``2 head_dim``
weights a layer and one element-wise pass over Q and K. DeepSeek-V3's multi-token prediction
module (``num_nextn_predict_layers``) is imported as ``mtp_layers``, trained beside the model
though transformers builds the model without it; the published 671B leaves its 14B out, and so
do the spec's parameter count and MFU (deepseek-ai/DeepSeek-V3 README, "685B ... 671B of the
Main Model weights and 14B of the Multi-Token Prediction (MTP) Module weights").

Fields given next to ``hf_config`` in the scenario override the imported ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustersim.errors import ScenarioError
from clustersim.yamlio import read_text_file

HF_KEY = "hf_config"
FIELD = f"model.{HF_KEY}"

# model_type -> the key holding the expert count (None: dense) and the expert MLP width.
ARCHITECTURES: dict[str, tuple[str | None, str]] = {
    "llama": (None, "intermediate_size"),
    "mistral": (None, "intermediate_size"),
    "qwen2": (None, "intermediate_size"),
    "qwen3": (None, "intermediate_size"),
    "mixtral": ("num_local_experts", "intermediate_size"),
    "qwen2_moe": ("num_experts", "moe_intermediate_size"),
    "qwen3_moe": ("num_experts", "moe_intermediate_size"),
    "deepseek": ("n_routed_experts", "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", "moe_intermediate_size"),
    "deepseek_v3": ("n_routed_experts", "moe_intermediate_size"),
}
# DeepSeek's fields the spec represents (``_deepseek_fields``); on another model_type they
# would mean something the import does not read, so they are refused there.
DEEPSEEK_TYPES = ("deepseek", "deepseek_v2", "deepseek_v3")
# Their routers that pick the token's best topk_group of n_group expert groups first
# (modeling_deepseek.py's MoEGate: V2's group_limited_greedy, V3's noaux_tc); "greedy" does not.
GROUP_LIMITED = ("group_limited_greedy", "noaux_tc")
DEEPSEEK_ONLY: list[tuple[str, Any, str]] = [
    ("n_shared_experts", 0, "shared experts outside DeepSeek's model types"),
    ("first_k_dense_replace", 0, "dense first layers outside DeepSeek's model types"),
    ("kv_lora_rank", None, "latent attention outside DeepSeek's model types"),
    ("q_lora_rank", None, "latent attention outside DeepSeek's model types"),
]

# (config key, value the spec can represent, why another value cannot be represented).
UNREPRESENTABLE: list[tuple[str, Any, str]] = [
    ("shared_expert_intermediate_size", 0,
     "a sigmoid-gated shared expert beside the routed ones (Qwen2-MoE)"),
    ("moe_layer_freq", 1, "MoE MLPs in only some layers"),
    ("decoder_sparse_step", 1, "MoE MLPs in only some layers"),
    ("mlp_only_layers", [], "dense MLPs in some layers of an MoE model"),
]


def anchor(raw: dict, scenario_path: str | Path) -> dict:
    """``raw`` with a relative ``model.hf_config`` made relative to the scenario file."""
    model = raw.get("model")
    if not isinstance(model, dict) or not isinstance(model.get(HF_KEY), str):
        return raw
    path = Path(model[HF_KEY]).expanduser()
    if path.is_absolute():
        return raw
    return {**raw, "model": {**model, HF_KEY: str(Path(scenario_path).parent / path)}}


def import_model(section: dict) -> dict:
    """The raw model mapping of ``{hf_config: PATH, **overrides}``: imported fields, overridden."""
    if "preset" in section:
        raise ScenarioError(FIELD, "give model.preset or model.hf_config, not both")
    path = section[HF_KEY]
    if not isinstance(path, str):
        raise ScenarioError(FIELD, f"expected a path to a config.json, got {path!r}")
    config = read_config(Path(path))
    overrides = {k: v for k, v in section.items() if k != HF_KEY}
    model = {**model_fields(config, _default_name(Path(path))), **overrides}
    _check_window(config, model.get("seq_len"))
    return model


def read_config(path: Path) -> dict:
    text = read_text_file(path, FIELD)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(FIELD, f"{str(path)!r} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ScenarioError(FIELD, f"{str(path)!r} is not a JSON object")
    return config


def model_fields(config: dict, name: str = "custom") -> dict:
    """ModelSpec fields of a transformers config; unsupported content raises ScenarioError."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ScenarioError(FIELD, f"unsupported architecture {model_type!r} (supported "
                                   f"model_type: {', '.join(ARCHITECTURES)})")
    _refuse_unrepresentable(config, [] if model_type in DEEPSEEK_TYPES else DEEPSEEK_ONLY)
    experts_key, ffn_key = ARCHITECTURES[model_type]
    heads = _required(config, "num_attention_heads")
    fields = {
        "name": name,
        "layers": _required(config, "num_hidden_layers"),
        "hidden": _required(config, "hidden_size"),
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads") or heads,
        "ffn_hidden": _required(config, ffn_key),
        "ffn_kind": _ffn_kind(config),
        "vocab": _required(config, "vocab_size"),
        "seq_len": _required(config, "max_position_embeddings"),
        "norm": "rmsnorm" if "rms_norm_eps" in config else _refuse("rms_norm_eps", None,
                                                                    "a norm other than RMSNorm"),
        "bias": _bias(config),
        "position_embedding": "rope",  # every architecture above rotates q and k (RoPE)
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        # transformers' decoders drop out only attention probabilities (attention_dropout,
        # 0.0 in the Llama, Mistral, Qwen and DeepSeek configs): no masks kept at 0.
        "dropout": float(config.get("attention_dropout") or 0.0),
    }
    if experts_key is not None:
        fields["experts"] = _required(config, experts_key)
        fields["top_k"] = _required(config, "num_experts_per_tok")
    if model_type in DEEPSEEK_TYPES:
        fields.update(_deepseek_fields(config))
    if "kv_lora_rank" not in fields:  # MLA's head widths are its own fields
        fields.update(_head_dim(config, fields))
    return fields


def _deepseek_fields(config: dict) -> dict:
    """Shared experts, dense first layers, group-limited routing and latent attention of a
    DeepSeek config (deepseek-ai's ``configuration_deepseek.py``: ``n_shared_experts`` experts
    of ``moe_intermediate_size``; the first ``first_k_dense_replace`` layers with an MLP of
    ``intermediate_size``; ``n_group`` and ``topk_group`` under a group-limited
    ``topk_method``; ``num_nextn_predict_layers`` multi-token prediction modules; MLA when
    ``kv_lora_rank`` is set, ``q_lora_rank`` null meaning a full-rank query projection)."""
    fields: dict[str, Any] = {}
    if config.get("n_shared_experts"):
        fields["shared_experts"] = config["n_shared_experts"]
    if config.get("first_k_dense_replace"):
        fields["dense_layers"] = config["first_k_dense_replace"]
        fields["dense_ffn_hidden"] = _required(config, "intermediate_size")
    if config.get("topk_method") in GROUP_LIMITED and (config.get("n_group") or 1) > 1:
        fields["expert_groups"] = config["n_group"]
        fields["expert_groups_per_token"] = _required(config, "topk_group")
    if config.get("num_nextn_predict_layers"):  # DeepSeek-V3's multi-token prediction
        fields["mtp_layers"] = config["num_nextn_predict_layers"]
    if config.get("kv_lora_rank") is not None:
        fields["kv_lora_rank"] = config["kv_lora_rank"]
        fields["q_lora_rank"] = config.get("q_lora_rank")
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            fields[key] = _required(config, key)
    return fields


def _required(config: dict, key: str) -> Any:
    if config.get(key) is None:
        raise ScenarioError(FIELD, f"the config has no {key!r}")
    return config[key]


def _refuse(key: str, value: Any, what: str) -> Any:
    raise ScenarioError(FIELD, f"{key} = {value!r}: {what} cannot be represented by the model "
                               "spec (see docs/scenario.md, 'Importing a Hugging Face config')")


def _refuse_unrepresentable(config: dict, extra: list[tuple[str, Any, str]]) -> None:
    for key, allowed, what in [*UNREPRESENTABLE, *extra]:
        value = config.get(key)
        if value is not None and value != allowed:
            _refuse(key, value, what)


def _ffn_kind(config: dict) -> str:
    # These architectures all gate their MLP (gate_proj * act(up_proj)); SiLU makes it SwiGLU.
    act = config.get("hidden_act", "silu")
    return "swiglu" if act == "silu" else _refuse("hidden_act", act, "a gated MLP other than "
                                                                     "SwiGLU")


def _bias(config: dict) -> bool:
    attention, mlp = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
    if attention != mlp:
        _refuse("attention_bias", attention, f"biases on attention but not MLP (mlp_bias = {mlp})"
                if attention else "biases on the MLP but not attention")
    return attention


def _head_dim(config: dict, fields: dict) -> dict:
    """``{"head_dim": d}`` where the config's head width is not ``hidden / heads`` (the spec's
    default), else nothing."""
    head_dim = config.get("head_dim")
    if head_dim is None or head_dim == fields["hidden"] / fields["heads"]:
        return {}
    return {"head_dim": head_dim}


def _check_window(config: dict, seq_len: Any) -> None:
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return
    if isinstance(seq_len, int) and seq_len > window:
        _refuse("sliding_window", window, f"windowed attention over seq_len = {seq_len} tokens "
                                          "(set model.seq_len to at most the window)")


def _default_name(path: Path) -> str:
    """``models/llama3-8b/config.json`` -> ``llama3-8b``; ``llama3-8b.json`` -> ``llama3-8b``."""
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem
