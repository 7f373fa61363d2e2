"""NVIDIA's DeepSeek-V3 run on 1,024 H100 against the model, as its recipe ran it and with each
of its MoE settings taken back (issue 23; docs/accuracy.md, "Fine-grained MoE").

    python3 benchmarks/deepseek_h100_recipe.py

Megatron-Bridge's performance summary for its 25.09 container prints DeepSeek-V3, dropless,
on 1,024 DGX H100: GBS 8192, MBS 1, sequence 4096, TP 2, PP 8, VP 4, EP 64, FP8, 1,297 tokens/s
per GPU (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @ 067f987df0). Its
recipe of that time (scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml and
run_script.py @ 47ff48829) adds what the table does not print: ``etp: 1`` (MoE parallel
folding), DeepEP, Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``),
``recompute_modules: [mla_up_proj, mlp]``, no gradient-reduction overlap, and the pipeline
layout ``Et|(tt|)*30mL``: the embedding and one layer, thirty chunks of two, then the
multi-token prediction module (the preset's ``mtp_layers: 1``) and the loss. It is the held-out
row ``megatron-bridge-deepseek-v3-fp8-1024xh100-25.09`` (tests/data/heldout-h100-moe.yaml); this
script takes its MoE settings back one at a time, and its MTP module.
"""

from __future__ import annotations

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario

PUBLISHED = 1297  # tokens/s per GPU
GPUS, BATCH, SEQ = 1024, 8192, 4096

AS_RUN = {"tp": 2, "pp": 8, "ep": 64, "expert_tp": 1, "sequence_parallel": True,
          "schedule": "combined-1f1b", "virtual_stages": 4, "stage_layers": [1] + [2] * 30 + [0],
          "moe_dispatcher": "deepep", "zero": 1, "recompute": "selective",
          "recompute_modules": ["mla_up_proj", "mlp"], "overlap_grad_reduce": False}
# Each MoE setting of the recipe taken back, one at a time, then all three.
VARIANTS = [
    ("as the recipe ran it", {}),
    ("all-to-alls not overlapped (interleaved)", {"schedule": "interleaved"}),
    ("Megatron-Core's alltoall dispatcher", {"moe_dispatcher": "alltoall"}),
    ("experts not folded (EP over DP, 16 nodes)", {"expert_tp": None}),
    ("all three", {"schedule": "interleaved", "moe_dispatcher": "alltoall", "expert_tp": None}),
]
NO_MTP = ("as run, without its MTP module", {"mtp_layers": 0})


def tokens_per_gpu(parallel: dict, model: dict | None = None) -> tuple[float, float]:
    """(tokens/s per GPU, seconds of exposed EP all-to-alls a step) as predicted."""
    r = simulate(build_scenario({
        "model": {"preset": "deepseek-v3", "seq_len": SEQ, "capacity_factor": None,
                  **(model or {})},
        "cluster": {"preset": "dgx-h100", "gpus": GPUS},
        "training": {"global_batch": BATCH, "micro_batch": 1, "precision": "fp8"},
        "parallel": {**AS_RUN, **parallel}}))
    alltoalls = max(st.comm.get("ep", 0.0) for st in r.stages)
    return BATCH * SEQ / r.step_time_s / GPUS, alltoalls


def main() -> None:
    print(f"DeepSeek-V3 on {GPUS:,} H100, published {PUBLISHED:,} tokens/s per GPU "
          "(Megatron-Bridge 25.09)")
    print(f"{'split':44s} {'predicted':>9s} {'pub/pred':>8s} {'EP all-to-alls':>15s}")
    rows = [(label, tokens_per_gpu(change)) for label, change in VARIANTS]
    rows.append((NO_MTP[0], tokens_per_gpu({}, NO_MTP[1])))
    for label, (tokens, alltoalls) in rows:
        print(f"{label:44s} {tokens:9,.0f} {PUBLISHED / tokens:8.2f} {alltoalls:13.1f} s")


if __name__ == "__main__":
    main()
