"""BLOOM's one-node runs on Jean Zay against the model: is the development set's BLOOM gap in
the network or inside a node? (issue 23, docs/accuracy.md "Where the gaps are")

    python3 benchmarks/bloom_node.py

The chronicles of BLOOM's preparation measured "best TFLOPs possible" on one node, so that no
traffic leaves it (bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles-prequel.md,
"Best TFLOPs", 2022-02-17): a 20B model (8 layers, hidden 14,400, 32 heads, vocabulary 250k,
2,048 tokens) over tp 8, global batch 2,048 in micro-batches of one, Megatron-DeepSpeed with
activation checkpointing, iteration 769.99 s in fp16 and 777.09 s in bf16. The model runs it on
the development set's rules (a DGX A100 80GB node, DeepSpeed, no flash attention, full
recomputation), ALiBi as no position embedding (its bias add is inside the softmax kernel).

Last, the all-reduce bus bandwidth that would close the gap if it were all tensor-parallel
traffic: DeepSpeed waits for each of a layer's six all-reduces (two in the forward, two in its
re-run, two in the backward; no sequence parallelism), each of s x h x 2 bytes, so the model's
exposed TP time is all of it, and 2 (t - 1) / t of those bytes over (that time + the gap) is the
bus bandwidth a node would need to have been measured so; beside it, the model's own.
"""

from __future__ import annotations

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

MEASURED_S = {"fp16": 769.99, "bf16": 777.09}
LAYERS, STEPS_PER_LAYER, TP = 8, 2048, 8  # micro-batches of one sequence
ALL_REDUCES = 6  # a layer's forward, re-run forward and backward, two each
MESSAGE_BYTES = 2048 * 14400 * 2  # one sequence's activations, 16-bit


def scenario(precision: str) -> dict:
    return {
        "model": {"layers": 8, "hidden": 14400, "heads": 32, "vocab": 250000, "seq_len": 2048,
                  "ffn_kind": "gelu", "norm": "layernorm", "bias": True,
                  "position_embedding": "none"},
        "cluster": {"preset": "dgx-a100-80gb", "gpus": 8},
        "training": {"framework": "deepspeed", "global_batch": 2048, "micro_batch": 1,
                     "precision": precision, "flash_attention": False},
        "parallel": {"tp": 8, "pp": 1, "dp": 1, "recompute": "full"},
    }


def main() -> None:
    print(f"{'precision':10s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}"
          f" {'exposed TP s':>12s} {'gap per layer and micro-batch':>30s}"
          f" {'busbw, model':>13s} {'busbw to close':>15s}")
    for precision, measured in MEASURED_S.items():
        r = simulate(build_scenario(scenario(precision)), "representative")
        slots = LAYERS * STEPS_PER_LAYER
        gap = (measured - r.step_time_s) / slots
        tp = r.stages[0].comm["tp"] / slots  # per layer and micro-batch
        bus_bytes = ALL_REDUCES * 2 * (TP - 1) / TP * MESSAGE_BYTES
        print(f"{precision:10s} {measured:10.2f} {r.step_time_s:11.2f} "
              f"{r.step_time_s / measured - 1:+7.1%} {r.breakdown.exposed_comm:12.2f} "
              f"{gap * 1e3:27.1f} ms {bus_bytes / tp / 1e9:8.0f} GB/s "
              f"{bus_bytes / (tp + gap) / 1e9:10.0f} GB/s")


if __name__ == "__main__":
    main()
