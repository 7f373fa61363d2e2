"""``recompute_modules: [mlp]``: Megatron-Core's ``recompute_mlp`` checkpoints a dense layer's
whole MLP (megatron/core/transformer/transformer_layer.py; MoE layers are left alone), keeping
only its input and re-running FC1, the activation and FC2, their TP collectives included, in
backward. Oracles: the MLP's tensors and GEMM FLOPs written out by hand."""

from __future__ import annotations

import pytest

from clustersim.simulator.closed_form.analytic import CostModel
from clustersim.simulator.costs.layer_comm import tp_collectives
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import workload as wl
from clustersim.simulator.model.activations import scenario_layer_bytes
from clustersim.simulator.model.recompute import rerun_gemms

SEQ, H, F, TP = 4096, 8192, 28672, 8  # Llama 3 70B's layer at tp 8


def llama(modules, sequence_parallel=True, model=None):
    return build_scenario({
        "model": model or {"preset": "llama3-70b", "seq_len": SEQ, "layers": 4},
        "cluster": {"preset": "dgx-h100", "gpus": TP},
        "training": {"global_batch": 1, "precision": "bf16"},
        "parallel": {"tp": TP, "sequence_parallel": sequence_parallel,
                     "recompute": "selective", "recompute_modules": modules}})


def test_the_mlp_keeps_nothing_but_its_input():
    plain, mlp = llama(["core_attn"]), llama(["core_attn", "mlp"])
    # FC1's input (ln_out, a sequence shard of h), SwiGLU's gate and up (2 f/t) and FC2's
    # input (f/t), bf16: what the checkpoint drops; its input is the residual, kept anyway
    dropped = 2 * SEQ * (H / TP + 3 * F / TP)
    before, after = (scenario_layer_bytes(s, "selective") for s in (plain, mlp))
    assert before - after == pytest.approx(dropped, rel=1e-12)


def test_backward_reruns_fc1_and_fc2():
    gemms = rerun_gemms(llama(["mlp"]))
    # gate and up (h -> f/t each) and down (f/t -> h): 2 T h f/t FLOPs each
    assert sum(g.flops for g in gemms) == pytest.approx(3 * 2 * SEQ * H * F / TP, rel=1e-12)
    assert wl.hardware_flops_per_step(llama(["mlp"])) > wl.hardware_flops_per_step(llama([]))


@pytest.mark.parametrize("sequence_parallel, kinds", [
    (True, {"allgather": 1, "reduce_scatter": 1}), (False, {"allreduce": 1})])
def test_its_tp_collectives_run_again_in_backward(sequence_parallel, kinds):
    def backward(modules):
        counts: dict[str, int] = {}
        for c in tp_collectives(llama(modules, sequence_parallel)):
            counts[c.kind] = counts.get(c.kind, 0) + c.backward
        return counts
    plain, mlp = backward(["core_attn"]), backward(["core_attn", "mlp"])
    assert {k: mlp[k] - plain[k] for k in mlp} == kinds


def test_moe_layers_are_left_alone_and_dense_first_layers_recompute():
    v3 = {"preset": "deepseek-v3", "seq_len": SEQ, "layers": 4, "dense_layers": 1}
    s = build_scenario({"model": v3, "cluster": {"preset": "dgx-h100", "gpus": 8},
                        "training": {"global_batch": 8},
                        "parallel": {"ep": 8, "recompute": "selective",
                                     "recompute_modules": ["mlp"]}})
    assert rerun_gemms(s) == ()
    dense = CostModel(s).dense_layer_costs
    assert len(rerun_gemms(dense.s)) == 3  # SwiGLU's gate, up and down
