"""``training.framework``: the defaults Megatron-LM, DeepSpeed and FSDP use, and nothing else.

Oracles: the ZeRO memory table (Rajbhandari et al. 2020, Figure 1) and the FSDP layout worked by
hand (fp32 sharded parameters as the master, 4 + 4 + 8 bytes per parameter with Adam); the ring
closed forms for DeepSpeed's pipeline engine, which reduces after the last micro-batch
(deepspeed/runtime/pipe/schedule.py ``TrainSchedule``: ``ReduceGrads`` at the end of the batch);
the spec's own field defaults, which scenarios written before the field rely on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_helpers import GB, model_states
from memory_helpers import scenario as memory_scenario
from sim_helpers import FREE, flat_profile

from clustersim.cli import main
from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.costs import memory as mem
from clustersim.simulator.costs import optimizer_states
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs import frameworks
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.inputs.specs import ParallelSpec, TrainingSpec
from clustersim.simulator.inputs.stack_defaults import Split
from clustersim.simulator.model import param_counts as pc

ROOT = Path(__file__).resolve().parents[2]


def llama7b(framework: str | None, zero: int | None = None, **training):
    """Llama 2 7B on 8 data-parallel A100s, bf16 unless told."""
    parallel = {} if zero is None else {"zero": zero}
    if framework is not None:
        training["framework"] = framework
    return memory_scenario("llama2-7b", gpus=8, training=training, **parallel)


# --- megatron is what a scenario without the field always meant ----------------------------------

def test_megatron_defaults_are_the_fields_own_defaults():
    """A scenario that names no framework keeps its meaning: megatron's row of every default
    is the value the spec declares for the field (SCENARIO.md), and under bf16 the fp32 main
    gradients Megatron-LM forces (megatron/training/arguments.py)."""
    fields = {**TrainingSpec.model_fields, **ParallelSpec.model_fields}
    for row in frameworks.DEFAULTS:
        name = row.field.split(".")[1]
        declared = fields[name].default
        if declared is not None:
            assert row.value("megatron", Split(0, pipelined=False)) == declared, row.field
    s = llama7b(None)
    assert s.training.framework == "megatron"
    assert (s.training.grad_dtype, s.training.master_weights) == ("fp32", "optimizer")
    assert s.as_dict() == llama7b("megatron").as_dict()


# --- optimizer state: the ZeRO table and the FSDP layout -----------------------------------------

@pytest.mark.parametrize("zero, printed_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1_holds_for_deepspeed_bf16_gradients(zero, printed_gb):
    """ZeRO Fig. 1 (Psi = 7.5B, N_d = 64, K = 12) with bf16 gradients, as DeepSpeed's ZeRO
    optimizer keeps them: 120 / 31.4 / 16.6 / 1.9 GB as printed."""
    got = optimizer_states.model_state_bytes(7.5e9, 64, zero, "bf16", "adam", "bf16", "optimizer")
    assert sum(got) / GB == pytest.approx(printed_gb, abs=0.05)


@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16"])
def test_fsdp_zero3_shard_is_4_plus_4_plus_8_bytes(grad_dtype):
    """FSDP's fully sharded Psi = 7.5B on 64 ranks, by hand: the fp32 parameter shard is the
    master (4 Psi / 64 = 0.469 GB), its gradient shard is fp32 whatever the reduction dtype
    (0.469 GB), Adam's two moments 8 Psi / 64 = 0.9375 GB: 1.875 GB, against Megatron's layout
    with fp32 main gradients, 18 Psi / 64 = 2.109 GB (2 + 4 + 12)."""
    fsdp = optimizer_states.model_state_bytes(7.5e9, 64, 3, "bf16", "adam", grad_dtype, "params")
    assert [b / GB for b in fsdp] == pytest.approx([0.46875, 0.46875, 0.9375])
    megatron = optimizer_states.model_state_bytes(7.5e9, 64, 3, "bf16", "adam", "fp32", "optimizer")
    assert sum(megatron) / GB == pytest.approx(2.109375)


@pytest.mark.parametrize("framework, zero, bytes_of", [
    # Megatron-LM, fp32 main gradients: 2 + 4 + 12 (dist_optimizer.md: 18, or 6 + 12/d)
    ("megatron", 0, lambda p: 18 * p), ("megatron", 1, lambda p: 6 * p + 12 * p / 8),
    ("megatron", 3, lambda p: 18 * p / 8),
    # DeepSpeed: stage 0 under bf16 is the BF16_Optimizer (fp32 gradients, sharded master and
    # moments), stages 1-3 the ZeRO table with bf16 gradients
    ("deepspeed", 0, lambda p: 6 * p + 12 * p / 8), ("deepspeed", 1, lambda p: 4 * p + 12 * p / 8),
    ("deepspeed", 2, lambda p: 2 * p + 14 * p / 8), ("deepspeed", 3, lambda p: 16 * p / 8),
    # FSDP: SHARD_GRAD_OP keeps the bf16 weights whole through the step, FULL_SHARD 4 + 4 + 8
    ("fsdp", 2, lambda p: 2 * p + 16 * p / 8), ("fsdp", None, lambda p: 16 * p / 8),
])
def test_each_stack_s_model_states_on_8_gpus(framework, zero, bytes_of):
    s = llama7b(framework, zero)
    assert model_states(s) == pytest.approx(bytes_of(pc.total_params(s.model)), rel=1e-12)


# --- what each stack resolves to -----------------------------------------------------------------

def resolved(s) -> tuple:
    t, p = s.training, s.parallel
    return (p.zero, t.grad_dtype, t.master_weights, p.overlap_grad_reduce,
            p.overlap_param_gather)


@pytest.mark.parametrize("framework, precision, zero, pp, expected", [
    ("megatron", "bf16", None, 1, (0, "fp32", "optimizer", True, True)),
    ("deepspeed", "bf16", None, 1, (1, "fp32", "optimizer", False, False)),  # BF16_Optimizer
    ("deepspeed", "fp16", None, 1, (0, "fp16", "optimizer", False, False)),  # FP16_Optimizer
    ("deepspeed", "bf16", 2, 1, (2, "bf16", "optimizer", False, False)),
    ("deepspeed", "bf16", 3, 1, (3, "bf16", "optimizer", True, True)),  # overlap_comm at 3
    ("deepspeed", "bf16", 1, 2, (1, "bf16", "optimizer", False, False)),
    ("fsdp", "bf16", None, 1, (3, "fp32", "params", True, True)),
    ("fsdp", "bf16", None, 2, (2, "fp32", "params", False, True)),  # torchtitan under pp
])
def test_each_stack_fills_what_the_scenario_left_out(framework, precision, zero, pp, expected):
    parallel = {"pp": pp, **({} if zero is None else {"zero": zero})}
    s = memory_scenario("llama2-7b", gpus=8, training={"framework": framework,
                                                       "precision": precision}, **parallel)
    assert resolved(s) == expected
    assert build_scenario(s.as_dict()).as_dict() == s.as_dict()  # the result's scenario reloads


def test_explicit_fields_override_the_framework():
    """Every field given wins over the stack's default, and the stack acts only through the
    fields: DeepSpeed with Megatron's values spelled out is Megatron, to the byte and second."""
    given = {"grad_dtype": "fp32", "attention_kernel": "flash3",
             "grad_accumulation_fusion": True}, {"zero": 1, "overlap_grad_reduce": True,
                                                 "overlap_param_gather": True,
                                                 "tp_backward_overlap": True, "cp_comm": "p2p"}
    ds = memory_scenario("llama2-7b", gpus=8, training={"framework": "deepspeed", **given[0]},
                         **given[1])
    mg = memory_scenario("llama2-7b", gpus=8, training=given[0], **given[1])
    assert resolved(ds) == (1, "fp32", "optimizer", True, True)
    ds_dict, mg_dict = ds.as_dict(), mg.as_dict()
    assert ds_dict["training"].pop("framework") == "deepspeed"
    assert mg_dict["training"].pop("framework") == "megatron"
    assert ds_dict == mg_dict
    assert estimate(ds).step_time_s == estimate(mg).step_time_s
    fsdp = memory_scenario("llama2-7b", gpus=8, zero=1, training={
        "framework": "fsdp", "grad_dtype": "bf16", "master_weights": "optimizer"})
    assert resolved(fsdp) == (1, "bf16", "optimizer", True, True)


@pytest.mark.parametrize("framework, cp_comm", [
    ("megatron", "p2p"), ("deepspeed", "a2a"), ("fsdp", "allgather")])
def test_each_stack_shares_keys_and_values_its_own_way(framework, cp_comm):
    """Megatron-Core's ring by default, DeepSpeed's Ulysses all-to-alls, torchtitan's
    all-gather; a given cp_comm wins."""
    s = memory_scenario("llama2-7b", gpus=8, cp=2, training={"framework": framework})
    assert s.parallel.cp_comm == cp_comm
    given = memory_scenario("llama2-7b", gpus=8, cp=2, cp_comm="p2p",
                            training={"framework": framework})
    assert given.parallel.cp_comm == "p2p"


@pytest.mark.parametrize("framework, recompute, given, recomputed", [
    ("fsdp", "selective", None, {"op_sac"}),  # torchtitan's default selective: op-level
    ("megatron", "selective", None, {"core_attn"}),  # Megatron-Core's default module
    ("deepspeed", "selective", None, {"core_attn"}),
    ("fsdp", "selective", ["core_attn"], {"core_attn"}),  # given wins
    ("fsdp", "full", None, set()),  # modules are selective recomputation's alone
])
def test_selective_recomputation_is_each_stack_s_own(framework, recompute, given, recomputed):
    parallel = {"recompute": recompute, **({} if given is None else {"recompute_modules": given})}
    s = memory_scenario("llama2-7b", gpus=8, training={"framework": framework,
                                                       "flash_attention": True}, **parallel)
    assert s.parallel.recomputed == recomputed
    assert build_scenario(s.as_dict()).as_dict() == s.as_dict()


@pytest.mark.parametrize("framework, sp, overlaps", [
    ("megatron", False, True), ("megatron", True, True),
    ("deepspeed", False, False),  # Megatron-DeepSpeed forces the async all-reduce off
    ("deepspeed", True, True),  # its sequence-parallel path reduce-scatters beside the GEMM
    ("fsdp", True, True)])
def test_backward_tp_collectives_overlap_as_each_stack_runs_them(framework, sp, overlaps):
    """Megatron-DeepSpeed's arguments.py turns `async_tensor_model_parallel_allreduce` off
    whenever DeepSpeed runs, so without sequence parallelism each column-parallel layer's input
    gradient is all-reduced after its backward GEMMs. The stack acts through the field alone:
    DeepSpeed's step is Megatron-LM's with the field and the other DeepSpeed defaults spelled
    out, and it is slower than with the overlap given back."""
    s = memory_scenario("llama2-7b", gpus=8, tp=4, sequence_parallel=sp,
                        training={"framework": framework})
    assert s.parallel.tp_backward_overlap is overlaps
    if framework != "deepspeed" or sp:
        return
    spelled = s.as_dict()
    spelled["training"]["framework"] = "megatron"
    assert estimate(build_scenario(spelled)).step_time_s == estimate(s).step_time_s
    spelled["parallel"]["tp_backward_overlap"] = True
    assert estimate(build_scenario(spelled)).step_time_s < estimate(s).step_time_s


def test_deepspeed_refuses_zero2_and_zero3_under_a_pipeline():
    with pytest.raises(Exception, match="parallel.zero"):
        memory_scenario("llama2-7b", gpus=8, pp=2, zero=2, training={"framework": "deepspeed"})


# --- DeepSpeed's pipeline engine reduces after the last micro-batch ------------------------------

# The NICs the DP ring crosses: 100 GB/s, no latency, so that the ring's time does not depend
# on how many buckets carry it.
SLOW = {"bandwidth": 100, "latency": 0.0}


def pipeline(framework: str, inter_node: dict):
    """pp 2 x dp 4: each pipeline on its own 2-GPU node (pp innermost), so the pipeline's
    sends stay on free NVLink and each DP group is a ring of 4 ranks over the NICs."""
    return build_scenario({
        "model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 8, "seq_len": 4096},
        "cluster": {"preset": "dgx-h100", "gpus": 8, "gpus_per_node": 2, "intra_node": FREE,
                    "inter_node": inter_node,
                    "gpu": {"preset": "h100-sxm", "memory_bandwidth": 1e12}},
        "training": {"global_batch": 16, "framework": framework, "grad_dtype": "bf16"},
        "parallel": {"pp": 2, "dp": 4, "zero": 1, "order": "tp-cp-pp-dp"}})


@pytest.mark.parametrize("predict", [
    lambda s: simulate(s, profile=flat_profile()), lambda s: estimate(s, flat_profile())],
    ids=["engine", "analytic"])
def test_deepspeed_pipeline_pays_the_whole_reduction_after_the_last_microbatch(predict):
    """DeepSpeed: the step grows by stage 0's whole reduce-scatter of its bf16 gradients and
    all-gather of its bf16 weights after the optimizer, (n-1)/n (2P + 2P)/B over the n = 4
    nodes: nothing of it hides behind a backward or the next forward. Megatron (the same fields
    but the overlaps) hides some of it behind the last backward and the first forward."""
    s = pipeline("deepspeed", SLOW)
    assert not (s.parallel.overlap_grad_reduce or s.parallel.overlap_param_gather)
    growth = {fw: predict(pipeline(fw, SLOW)).step_time_s - predict(pipeline(fw, FREE)).step_time_s
              for fw in ("deepspeed", "megatron")}
    dense, expert = mem.stage_params_per_rank(s, 0)
    assert expert == 0
    n, b = 4, SLOW["bandwidth"] * 1e9
    ring = (n - 1) / n * (2 * dense + 2 * dense) / b
    assert growth["deepspeed"] == pytest.approx(ring, rel=1e-6)
    assert growth["megatron"] < 0.9 * ring


# --- bad input -----------------------------------------------------------------------------------

GOOD = """\
model: {preset: gpt-1.7b}
cluster: {preset: dgx-a100-80gb, gpus: 16}
training: {global_batch: 64}
parallel: {pp: 2}
"""


@pytest.mark.parametrize("setting, field, words", [
    ("training.framework=colossalai", "training.framework", ["megatron", "deepspeed", "fsdp"]),
    ("parallel.zero=2", "parallel.zero", ["pipeline", "ZeRO stage 0 or 1"]),
])
def test_bad_framework_input_is_one_error_line(capsys, tmp_path, setting, field, words):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    code = main(["simulate", str(path), "--set", "training.framework=deepspeed",
                 "--set", setting])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}")
    assert all(w in err for w in words)


# --- the documented table ------------------------------------------------------------------------

def test_docs_print_the_defaults_the_code_resolves():
    """docs/frameworks.md holds ``markdown_table()`` as generated from ``DEFAULTS``."""
    assert frameworks.markdown_table() in (ROOT / "docs" / "frameworks.md").read_text()


def test_each_stack_runs_its_attention_kernels_at_their_measured_speed():
    """On H100, Megatron-Core's cuDNN fused attention (flash3 class) runs at FlashAttention-3's
    measured fraction of peak and FSDP's SDPA (FlashAttention-2) at FlashAttention-2's: the
    figures of topologies/measurements/kernels.yaml, 0.628 and 0.339 at 16K tokens, each
    carried to 8K by its family's fixed work per query row (350 and 280 keys forward), so the
    attention core of the same layer takes their ratio longer under FSDP forward."""
    def at_8k(at_16k: float, fixed: float) -> float:
        return at_16k * (16384 + fixed) / 16384 * 8192 / (8192 + fixed)
    from clustersim.simulator.closed_form.analytic import CostModel, kernel_times
    base = {"model": {"preset": "llama2-7b", "seq_len": 8192},
            "cluster": {"preset": "dgx-h100", "gpus": 8}, "training": {"global_batch": 8}}
    times = {}
    for stack in ("megatron", "fsdp"):
        s = build_scenario({**base, "training": {**base["training"], "framework": stack}})
        times[stack] = kernel_times(CostModel(s))[1][0]
    assert times["fsdp"] / times["megatron"] == pytest.approx(
        at_8k(0.628, 350) / at_8k(0.339, 280), rel=0.01)


def test_llm_foundrys_triton_attention_takes_the_fa2_papers_ratio_longer_on_a100():
    """``attention_kernel: triton`` (FlashAttention in Triton, llm-foundry's 2023 default) on
    A100: the same layer's attention core takes 1.4x FlashAttention-2's time forward (Dao 2023,
    sec. 4.1: 1.3-1.5x); on H100, with no published figure for it, it runs as flash2."""
    from clustersim.simulator.closed_form.analytic import CostModel, kernel_times
    def core_forward(preset: str, kernel: str) -> float:
        s = build_scenario({"model": {"preset": "llama2-7b", "seq_len": 8192},
                            "cluster": {"preset": preset, "gpus": 8},
                            "training": {"global_batch": 8, "framework": "fsdp",
                                         "attention_kernel": kernel}})
        return kernel_times(CostModel(s))[1][0]
    assert core_forward("dgx-a100-80gb", "triton") / core_forward("dgx-a100-80gb", "flash2") \
        == pytest.approx(1.4, rel=0.01)
    assert core_forward("dgx-h100", "triton") == core_forward("dgx-h100", "flash2")


def test_megatron_runs_each_gpus_own_attention_kernel():
    """Transformer Engine picks by GPU: cuDNN's fused attention on Hopper and later, flash-attn 2
    before ("Disabling FlashAttention to give FusedAttention preference on Hopper+",
    transformer_engine/pytorch/attention/dot_product_attention/utils.py). Megatron's default
    names no family, and each GPU runs its profile's own: the same attention core as flash2's
    on A100 and as flash3's on H100, where DeepSpeed and FSDP ask for flash2 on both."""
    from clustersim.simulator.closed_form.analytic import CostModel, kernel_times
    def core(preset: str, **training) -> tuple:
        s = build_scenario({"model": {"preset": "llama2-7b", "seq_len": 8192},
                            "cluster": {"preset": preset, "gpus": 8},
                            "training": {"global_batch": 8, **training}})
        return s.training.attention_kernel, kernel_times(CostModel(s))[1]
    for preset, own in (("dgx-a100-80gb", "flash2"), ("dgx-h100", "flash3")):
        kernel, times = core(preset, framework="megatron")
        assert kernel is None
        assert times == core(preset, framework="megatron", attention_kernel=own)[1]
    assert core("dgx-h100", framework="deepspeed")[0] == "flash2"
    assert core("dgx-h100", framework="megatron")[1] != core("dgx-h100", framework="fsdp")[1]
