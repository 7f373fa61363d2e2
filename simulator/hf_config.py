"""``model: {hf_config: config.json}``: a Hugging Face transformers config as a model spec.

Reads the fields transformers' ``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``,
``Qwen2Config``, ``Qwen2MoeConfig`` and DeepSeek's ``DeepseekConfig`` share (field names from
transformers ``src/transformers/models/<model>/configuration_<model>.py`` and
deepseek-ai/deepseek-moe-16b-base ``configuration_deepseek.py``) and maps them onto ModelSpec's
fields. Every layer of a ModelSpec has the same attention and the same MLP, with biases on all
linear layers or on none; a config that needs more than that (shared experts, dense first
layers, latent attention, a head width other than ``hidden / heads`` ...) is refused with one
``model.hf_config`` error naming the field, never imported approximately. The one documented
approximation: Qwen2's q/k/v projections carry biases in transformers whatever the config says
(``modeling_qwen2.py``), which the spec's all-or-nothing ``bias`` cannot say; they are left out
(0.002% of Qwen2-7B's parameters).

Fields given next to ``hf_config`` in the scenario override the imported ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustersim.errors import ScenarioError

HF_KEY = "hf_config"
FIELD = f"model.{HF_KEY}"

# model_type -> the key holding the expert count (None: dense) and the expert MLP width.
ARCHITECTURES: dict[str, tuple[str | None, str]] = {
    "llama": (None, "intermediate_size"),
    "mistral": (None, "intermediate_size"),
    "qwen2": (None, "intermediate_size"),
    "mixtral": ("num_local_experts", "intermediate_size"),
    "qwen2_moe": ("num_experts", "moe_intermediate_size"),
    "deepseek": ("n_routed_experts", "moe_intermediate_size"),
}

# (config key, value the spec can represent, why another value cannot be represented).
UNREPRESENTABLE: list[tuple[str, Any, str]] = [
    ("n_shared_experts", 0, "shared experts (always-active experts beside the routed ones)"),
    ("shared_expert_intermediate_size", 0, "a shared expert beside the routed ones"),
    ("first_k_dense_replace", 0, "dense MLPs in the first layers of an MoE model"),
    ("moe_layer_freq", 1, "MoE MLPs in only some layers"),
    ("decoder_sparse_step", 1, "MoE MLPs in only some layers"),
    ("mlp_only_layers", [], "dense MLPs in some layers of an MoE model"),
    ("kv_lora_rank", None, "multi-head latent attention"),
    ("q_lora_rank", None, "multi-head latent attention"),
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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(FIELD, f"cannot read {str(path)!r}: {exc.strerror}") from None
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
    _refuse_unrepresentable(config)
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
    }
    if experts_key is not None:
        fields["experts"] = _required(config, experts_key)
        fields["top_k"] = _required(config, "num_experts_per_tok")
    _check_head_dim(config, fields)
    return fields


def _required(config: dict, key: str) -> Any:
    if config.get(key) is None:
        raise ScenarioError(FIELD, f"the config has no {key!r}")
    return config[key]


def _refuse(key: str, value: Any, what: str) -> Any:
    raise ScenarioError(FIELD, f"{key} = {value!r}: {what} cannot be represented by the model "
                               "spec (see docs/scenario.md, 'Importing a Hugging Face config')")


def _refuse_unrepresentable(config: dict) -> None:
    for key, allowed, what in UNREPRESENTABLE:
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


def _check_head_dim(config: dict, fields: dict) -> None:
    head_dim = config.get("head_dim")
    implied = fields["hidden"] / fields["heads"]
    if head_dim is not None and head_dim != implied:
        _refuse("head_dim", head_dim,
                f"a head width other than hidden_size / num_attention_heads = {implied:g}")


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
