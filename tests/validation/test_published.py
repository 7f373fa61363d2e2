"""Published tables and the line between fitted and held-out comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.topologies.profile import profile_for_gpu
from clustersim.validation import published as pub

DATA = Path(__file__).parent.parent / "data"


def test_a_table_loads_with_its_metric_and_printed_figures():
    cases = pub.load_table(DATA / "megatron2021.yaml")
    assert len(cases) == 10
    assert {c.metric for c in cases} == {"hardware_tflops_per_gpu"}
    assert cases[0].published == 137.0 and cases[0].table == "megatron2021"


def test_a_what_if_sets_its_fields_on_every_case_and_nothing_else():
    """``load_table(parallel=..., training=...)``: the same runs under other settings (the
    A100 fit's 2021-code variant, benchmarks/fit_2021_code.py); the printed figures and every
    other field stay as the table has them."""
    plain = pub.load_table(DATA / "megatron2021.yaml")
    what_if = pub.load_table(DATA / "megatron2021.yaml", {"tp_backward_overlap": False},
                             {"grad_accumulation_fusion": False})
    assert [c.published for c in what_if] == [c.published for c in plain]
    for a, b in zip(plain, what_if, strict=True):
        before, after = a.scenario.as_dict(), b.scenario.as_dict()
        assert before["parallel"]["tp_backward_overlap"] is True
        assert before["training"]["grad_accumulation_fusion"] is True
        assert after["parallel"]["tp_backward_overlap"] is False
        assert after["training"]["grad_accumulation_fusion"] is False
        after["parallel"]["tp_backward_overlap"] = after["training"][
            "grad_accumulation_fusion"] = True
        assert after == before


def test_held_out_comparison_refuses_the_table_a_profile_was_fitted_on():
    """A profile that names a table in ``fitted_on`` cannot be 'validated' against it."""
    cases = pub.load_table(DATA / "megatron2021.yaml")[:1]
    fitted = profile_for_gpu("a100-80gb").model_copy(update={"fitted_on": ["megatron2021"]})
    with pytest.raises(pub.FittedDataError, match="megatron2021"):
        pub.held_out_rows(cases, fitted)
    other = fitted.model_copy(update={"fitted_on": ["megatron-core-h100"]})
    assert len(pub.held_out_rows(cases, other)) == 1


def test_split_fitted_sets_apart_the_cases_of_a_table_the_profile_was_fitted_on():
    """What benchmarks/accuracy.py reports as fitted follows ``fitted_on`` alone: name a table
    there and its cases leave the held-out side."""
    cases = pub.load_table(DATA / "megatron2021.yaml")[:2]
    fitted = profile_for_gpu("a100-80gb").model_copy(update={"fitted_on": ["megatron2021"]})
    assert pub.split_fitted(cases, fitted) == ([], cases)
    other = fitted.model_copy(update={"fitted_on": ["megatron-core-h100"]})
    assert pub.split_fitted(cases, other) == (cases, [])


def test_rows_measure_what_the_table_printed():
    """The row's prediction is the StepResult's figure for the case's metric; HFU is hardware
    FLOP/s (recomputation counted) over the GPU's peak, as Korthikanti et al. define it."""
    case = pub.load_table(DATA / "megatron2021.yaml")[0]
    result = estimate(case.scenario)
    [row] = pub.predict_rows([case])
    assert row.predicted == result.hardware_tflops_per_gpu
    peak = case.scenario.cluster.gpu.peak_flops["bf16"]
    assert pub.measure(result, "hfu") == pytest.approx(result.hardware_tflops_per_gpu * 1e12 / peak)
    assert row.error == pytest.approx((row.predicted - 137.0) / 137.0)


def held_out_everything() -> list[pub.Row]:
    """Every held-out comparison benchmarks/accuracy.py reports: each Megatron table under the
    profile fitted on the other (A100 <-> H100), and the held-out files under the shipped
    profiles (analytic estimate)."""
    rows = []
    for table, gpu in (("megatron2021", "h100-sxm"), ("megatron-core-h100", "a100-80gb")):
        rows += pub.held_out_rows(pub.load_table(DATA / f"{table}.yaml"), profile_for_gpu(gpu))
    for path in sorted(DATA.glob("heldout-*.yaml")):
        rows += pub.held_out_rows(pub.load_table(path))
    return rows


def test_held_out_error_stays_below_its_recorded_level():
    """A regression guard, not the goal: on the 47 held-out published runs the analytic
    estimate read 18.4% mean and 37.8% worst absolute error when this test was written, 17.6%
    once ZeRO-2 under a pipeline reduced once a step, 13.0% and 48.4% with profiles derived
    from kernel measurements (issue 23; the worst is Megatron-Core's 1.7B H100 row under the
    A100 profile, whose fixed step time the A100's table does not show); 12.8% and 48.4% over
    49 runs with the two FP8 runs of heldout-h100-fp8.yaml; 61 runs with NeMo 24.07's twelve
    (heldout-h100-fp8-nemo2407.yaml); 67 with torchtitan's six FSDP2 runs on A100
    (heldout-a100-torchtitan.yaml); 78 with the NeMo Launcher README's eleven 2022 A100 runs
    (heldout-a100-nemo-launcher.yaml); 91 with MLPerf Training's thirteen GPT-3 175B FP8 runs
    of rounds v3.0 and v3.1 on 512-10,752 H100 (heldout-h100-mlperf-v30.yaml, -v31.yaml: 7.7%
    mean, 29.5% worst); 94 with v4.0's three (-v40.yaml); 99 with v4.1's four on H100 and one
    on B200 (heldout-h100-mlperf-v41.yaml, heldout-b200-mlperf-v41.yaml); 100 with Nemotron-4
    340B's pre-training on 6,144 H100 (heldout-h100.yaml); 101 with Megatron-Bridge's Llama 3.1
    405B FP8 on 1,024 H100 (heldout-h100-fp8.yaml); 104 with MT-NLG 530B's three on 2,240-3,360
    A100 (heldout-a100-mtnlg.yaml); 130 with llm-foundry's 26 sequence-sweep rows on 8 A100
    (heldout-a100-llm-foundry-seq.yaml: 9.9% mean, 42.2% worst; 9.5% and 30.6% once those runs
    ran FlashAttention in Triton, as they did); 175 with llm-foundry's 45 A100 40GB rows
    (heldout-a100-40gb-llm-foundry.yaml: 9.0% mean, 30.5% worst over all); 214 with the 39
    other rows of llm-foundry's H100 table (heldout-h100-llm-foundry-seq.yaml: 9.4% and 31.5%
    over all); 222 with Megatron-Bridge's eight MoE runs, Qwen3-30B-A3B on 16 H100 and 8 B200
    and DeepSeek-V3 on 256 B200 (heldout-h100-moe.yaml, heldout-b200-moe.yaml: 84% mean, 165%
    worst, the dropless Qwen3 runs at under half the predicted speed; guarded apart so that they
    hide no regression elsewhere); 230 with eight later ones, Qwen3-30B-A3B's 26.02.01 and
    26.04.01, Qwen3-235B-A22B's 26.02 and 26.04.01 and DeepSeek-V3's 25.09 on H100, and
    DeepSeek-V3's 25.11 and 26.02.01 and Qwen3-30B-A3B's 26.02.01 on B200 (MoE parallel
    folding, combined 1F1B and the MTP module; 4-38% each, the MoE rows 52% mean).
    No shipped profile was fitted on any of them:
    held_out_rows refuses otherwise."""
    rows = held_out_everything()
    assert len(rows) == 230
    moe = [r for r in rows if r.case.table.endswith("-moe")]
    mean, worst = pub.summary([r for r in rows if r not in moe])
    assert mean < 0.14 and worst < 0.50, (mean, worst)
    mean, worst = pub.summary(moe)
    assert len(moe) == 16 and mean < 0.60 and worst < 1.75, (mean, worst)


def test_mlperf_v31_gpt3_runs_are_predicted_within_5_percent_at_every_scale():
    """MLPerf Training v3.1's GPT-3 175B submissions (one split, FP8 with TP comm overlap, 512 to
    10,752 H100, 128 down to 8 micro-batches per pipeline) fitted nothing; the engine, as
    benchmarks/accuracy.py runs it, reads each run's tokens/s within 5% (1-4% when written,
    within 2% once the runs took FlashAttention-2, the kernel they installed)."""
    from clustersim.validation.accuracy import predictor

    rows = pub.held_out_rows(pub.load_table(DATA / "heldout-h100-mlperf-v31.yaml"),
                             predict=predictor("representative"))
    assert len(rows) == 8
    assert all(abs(row.error) < 0.05 for row in rows), [(r.case.id, r.error) for r in rows]


def test_nemotron4_340b_pretraining_is_predicted_within_5_percent():
    """Nemotron-4 340B's pre-training on 6,144 H100 (report Table 2: 8.0 s an iteration), as
    NVIDIA's launcher configuration ran it (bf16, TP 8, PP 12 with 8 virtual stages, selective
    recomputation, no userbuffers overlap, the optimizer's state in bf16 with no fp32 master),
    fitted nothing; the engine reads its tokens/s within 5% (-1.0% when written). Counted with
    a whole fp32 master and fp32 moments, as before ``master_weights`` and
    ``optimizer_moments`` existed, it still fits and the step barely moves: this run is decided
    by its time, not its memory."""
    from clustersim.validation.accuracy import predictor

    cases = [c for c in pub.load_table(DATA / "heldout-h100.yaml")
             if c.id == "nemotron4-340b-pretrain-6144xh100"]
    rows = pub.held_out_rows(cases, predict=predictor("representative"))
    assert len(rows) == 1 and abs(rows[0].error) < 0.05, rows[0].error
