"""Small scenarios shared by the memory tests: GPT- and Llama-shaped models on a few GPUs."""

from __future__ import annotations

from clustersim.simulator.costs import memory as mem
from clustersim.simulator.inputs.scenario import build_scenario

GB = 1e9


def gpt(layers=8, hidden=256, heads=8, vocab=1000, seq_len=128, **kw) -> dict:
    """A GPT-shaped model: LayerNorm, biases, learned positions, tied embeddings, GELU, f = 4h."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab,
            "seq_len": seq_len, **kw}


def llama(**kw) -> dict:
    """A Llama-shaped model: RMSNorm, no biases, RoPE, untied output layer, SwiGLU."""
    return gpt(**{"norm": "rmsnorm", "bias": False, "position_embedding": "rope",
                  "tie_embeddings": False, "ffn_kind": "swiglu", **kw})


def scenario(model, gpus=4, global_batch=8, training=None, cluster="dgx-a100-80gb", **parallel):
    """A scenario on ``gpus`` GPUs; ``model`` is a mapping of ModelSpec fields or a preset name."""
    model = {"preset": model} if isinstance(model, str) else model
    return build_scenario({"model": model, "cluster": {"preset": cluster, "gpus": gpus},
                           "training": {"global_batch": global_batch, **(training or {})},
                           "parallel": parallel})


def model_states(s, stage=0) -> float:
    return sum(mem.stage_model_states(s, stage))
