"""``model.mtp_layers``: DeepSeek-V3's multi-token prediction (arXiv 2412.19437 sec. 2.2;
Megatron-Core's ``--mtp-num-layers``). Each module projects the hidden state and the next
token's embedding, each normed, from ``2h`` to ``h``, runs one more layer like the model's last,
and the shared output layer and loss again, all in the last pipeline chunk (Megatron-Core's
layout "...mL"). Oracles: the module's parts counted by hand against the same scenario without
it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.reports.megatron import megatron_args
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import compute
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.hf_config import model_fields, read_config
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.model import activations as act
from clustersim.simulator.model import param_counts as pc
from clustersim.simulator.model import workload as wl
from clustersim.simulator.pipeline.stages import chunk_mix, stage_mix


def deepseek(mtp: int = 1, pp: int = 4, **parallel):
    return build_scenario({
        "model": {"preset": "deepseek-v3", "layers": 12, "mtp_layers": mtp, "seq_len": 4096},
        "cluster": {"preset": "dgx-h100", "gpus": 8 * pp},
        "training": {"global_batch": 16 * pp, "precision": "bf16"},
        "parallel": {"tp": 1, "pp": pp, "ep": 8, "zero": 1, **parallel}})


def test_the_modules_layers_run_in_the_last_chunk_of_each_copy():
    assert chunk_mix(deepseek(1)) == [(3, 0), (0, 3), (0, 3), (0, 3 + 1)]
    assert chunk_mix(deepseek(0))[-1] == (0, 3)
    # DualPipe's two copies of the model each end in their own module
    dual = chunk_mix(deepseek(1, schedule="dualpipe", virtual_stages=2))
    assert sum(other for _, other in dual) == 2 * (12 - 3 + 1)
    assert stage_mix(deepseek(2, pp=1)) == [(3, 9 + 2)]


def test_the_head_runs_once_more_a_module_after_its_projection():
    with_mtp, without = CostModel(deepseek(1)), CostModel(deepseek(0))
    proj = wl.mtp_projection_gemm(with_mtp.s)
    assert (proj.m, proj.n, proj.k) == (4096, 7168, 2 * 7168)
    head = compute.logits_times(without)
    by_hand = (2 * head[0] + compute.gemm_time(with_mtp, proj, proj.m),
               2 * head[1] + compute.backward_gemm_time(with_mtp, proj, proj.m))
    assert compute.logits_times(with_mtp) == pytest.approx(by_hand, rel=1e-12)


def test_its_parameters_and_activations_sit_on_the_last_stage_only():
    m1, m0 = deepseek(1).model, deepseek(0).model
    extra = mem.head_params_per_rank(m1, 1, apart=True) - mem.head_params_per_rank(
        m0, 1, apart=True)
    assert extra == pytest.approx(2 * 7168 * 7168 + 3 * 7168)  # projection and three norms
    assert pc.total_params(m1) == pc.total_params(m0)  # the published size leaves it out
    first, last = (mem.stage_params_per_rank(deepseek(1), i)[1]
                   - mem.stage_params_per_rank(deepseek(0), i)[1] for i in (0, 3))
    assert first == 0 and last == pytest.approx(
        pc.layer_params_per_rank(m1, 1, 8)[1])  # one more layer's experts
    head = act.head_bytes(m0, 4096, 1, 1, "bf16")
    assert act.head_bytes(m1, 4096, 1, 1, "bf16") == pytest.approx(
        2 * head + 2 * 2 * 4096 * 7168)  # its own head, and its projection's input


def test_it_paces_the_pipeline_from_the_last_stage_in_both_estimators():
    s = deepseek(1, pp=4)
    engine = simulate(s)
    assert estimate(s).step_time_s == pytest.approx(engine.step_time_s, rel=0.02)
    stages = engine.stages
    assert stages[-1].compute > stages[1].compute
    assert simulate(deepseek(0, pp=4)).step_time_s < engine.step_time_s


def test_deepseek_v3s_hf_config_and_megatrons_arguments_name_it():
    config = read_config(Path(__file__).resolve().parents[1] / "data" / "hf" / "deepseek-v3.json")
    assert model_fields(config)["mtp_layers"] == 1
    assert "--mtp-num-layers 1" in megatron_args(deepseek(1))
    assert not any("mtp" in a for a in megatron_args(deepseek(0)))
