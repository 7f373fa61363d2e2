"""The development set's rules: how a published run becomes scenarios, and how runs are scored.

The oracles are the published facts in tests/data/published-dev.yaml (read here as raw YAML),
the rules the shared ``devset.py`` script states, and scores worked out by hand. No simulation
runs here; tests/validation/test_accuracy.py scores the whole set once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clustersim.topologies.profile import profile_for_gpu
from clustersim.validation import devset
from clustersim.validation.accuracy import split_dev
from clustersim.yamlio import load_yaml_file

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "tests" / "data" / "published-dev.yaml"
SHARED_SCRIPT = ROOT.parent / "shared" / "validation" / "devset.py"


@pytest.fixture(scope="module")
def raw_runs() -> dict[str, dict]:
    return {raw["id"]: raw for raw in load_yaml_file(DEV)}


def test_a_vtrain_run_keeps_its_documented_network_and_software(raw_runs):
    """vTrain's configs: 800 Gb/s per 8-GPU node (12.5 GB/s per GPU), gradient bucketing off,
    no FlashAttention; the A100's memory is not stated, so the 80 GB DGX; vocab not
    published, so Megatron's GPT default 51200; the time is printed in milliseconds."""
    run = devset.to_run(raw_runs["vtrain-multi-3.6b-t8-d8-p1-mbs64"])
    [s] = run.candidates
    assert s["cluster"] == {"preset": "dgx-a100-80gb", "gpus": 64,
                            "inter_node": {"bandwidth": 12.5}}
    assert s["parallel"]["overlap_grad_reduce"] is False
    assert (s["parallel"]["tp"], s["parallel"]["pp"], s["parallel"]["dp"]) == (8, 1, 8)
    assert s["parallel"]["recompute"] == "full" and s["parallel"]["schedule"] == "1f1b"
    assert s["training"] == {"global_batch": 512, "micro_batch": 64, "precision": "fp16",
                             "flash_attention": False}
    assert s["model"]["vocab"] == 51200 and s["model"]["ffn_kind"] == "gelu"
    assert run.published_s == pytest.approx(9.8389) and run.oom is None


def test_korthikanti_interleaved_run_keeps_its_schedule_and_selective_recompute(raw_runs):
    """Korthikanti et al. Table 3: 175B on 64 GPUs, tp8 pp8, interleaved with 3 chunks,
    sequence parallelism and selective recomputation; Selene's network is a DGX's."""
    run = devset.to_run(raw_runs["korthikanti2022-t5-175b-sp-selective"])
    [s] = run.candidates
    assert s["parallel"]["schedule"] == "interleaved" and s["parallel"]["virtual_stages"] == 3
    assert s["parallel"]["sequence_parallel"] is True
    assert s["parallel"]["recompute"] == "selective"
    assert "inter_node" not in s["cluster"] and "overlap_grad_reduce" not in s["parallel"]
    assert s["training"]["precision"] == "bf16" and s["training"]["flash_attention"] is False
    assert run.published_s == 13.75


def test_a_bloom_oom_outcome_is_a_run_without_a_time(raw_runs):
    """BLOOM's sweep: Jean Zay's 4 x 100 Gb/s Omni-Path per 8 GPUs is 6.25 GB/s per GPU."""
    run = devset.to_run(raw_runs["bloom-prequel-0225-181b-dp32-tp2-pp6-mbs1-gbs2048"])
    assert run.oom is True and run.published_s is None
    [s] = run.candidates
    assert s["cluster"]["inter_node"] == {"bandwidth": 6.25}
    assert s["training"]["precision"] == "fp16"
    assert run.job == ("bloom", 72, 14336, 384, 2048)  # the 181B shape: 72 layers


def test_runs_without_a_comparable_figure_are_left_out(raw_runs):
    """Korthikanti's Appendix C runs print an MFU gain only; every other run is scored."""
    assert devset.to_run(raw_runs["korthikanti2022-appC-175b-microbatch-level-recompute"]) is None
    runs = devset.load_runs(DEV)
    assert len(runs) == len(raw_runs) - 2
    timed = [r for r in raw_runs.values() if r["measured"].get("iteration_time_s")
             or r["measured"].get("iteration_time_ms")]
    assert sum(run.published_s is not None for run in runs) == len(timed)
    assert sum(run.oom is not None for run in runs) == sum(
        r["measured"].get("oom") is not None for r in raw_runs.values())


def test_an_unpublished_recomputation_is_simulated_over_its_candidates(raw_runs):
    """Selective recomputation appeared in 2022-05: BLOOM's candidates are none and full."""
    raw = raw_runs["bloom-176b-production-iter85376"]
    unpublished = {**raw, "parallelism": {**raw["parallelism"], "recompute": None}}
    kinds = [s["parallel"]["recompute"] for s in devset.to_run(unpublished).candidates]
    assert kinds == ["none", "full"]
    later = {**unpublished, "group": "vtrain-multi-node"}
    kinds = [s["parallel"]["recompute"] for s in devset.to_run(later).candidates]
    assert kinds == ["none", "selective", "full"]


def test_gpu_names_choose_the_cluster_preset():
    assert devset.cluster_preset("A100-SXM4-40GB") == "dgx-a100-40gb"
    assert devset.cluster_preset("A100-SXM4-80GB") == "dgx-a100-80gb"
    assert devset.cluster_preset("H100-SXM5") is None


@pytest.mark.skipif(not SHARED_SCRIPT.exists(), reason="the shared published data is absent")
def test_same_scenarios_as_the_shared_script():
    """Every run becomes the scenarios ../shared/validation/devset.py makes of it, with the
    same published figures, so the scores are that script's (no simulation needed to check)."""
    spec = importlib.util.spec_from_file_location("shared_devset", SHARED_SCRIPT)
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)
    import yaml

    raws = yaml.safe_load(SHARED_SCRIPT.with_name("published-dev.yaml").read_text())
    ours = {run.id: run for run in devset.load_runs(DEV)}
    compared = 0
    for raw in raws:
        scenario, ref = shared.scenario(raw)
        if scenario is None:
            assert raw["id"] not in ours
            continue
        run = ours[raw["id"]]
        assert list(run.candidates) == ref["candidates"], raw["id"]
        assert (run.published_s, run.oom) == (ref.get("value"), ref.get("oom")), raw["id"]
        assert run.source == ref["group"]
        compared += 1
    assert compared == len(ours)


# ------------------------------------------------------------------------------------ scoring


def result(source: str, published: float | None, predicted: float, *, fits: bool = True,
           oom: bool | None = None, job: tuple = ("job",), fitted_on: tuple = ()):
    run = devset.DevRun(f"{source}-{published}-{predicted}", source, (), job, published, oom)
    profile = profile_for_gpu("a100-80gb").model_copy(update={"fitted_on": list(fitted_on)})
    return devset.DevResult(run, predicted, fits, profile)


def test_per_source_mean_signed_and_worst_by_hand():
    # errors -10%, +20% and -30% in source a; +5% in source b
    results = [result("a", 10, 9), result("a", 10, 12), result("a", 10, 7), result("b", 20, 21)]
    a, b = devset.score(results).sources
    assert (a.source, a.runs) == ("a", 3)
    assert a.mean_abs == pytest.approx(0.2) and a.signed == pytest.approx(-0.2 / 3)
    assert a.worst == pytest.approx(0.3)
    assert (b.mean_abs, b.signed, b.worst) == pytest.approx((0.05, 0.05, 0.05))


def test_memory_agreement_counts_fit_against_published_oom():
    results = [result("a", None, 1, fits=False, oom=True),   # agrees
               result("a", None, 1, fits=True, oom=True),    # predicted to fit, did not
               result("a", 10, 11, fits=True, oom=False),    # agrees
               result("a", 10, 11, fits=False)]              # no outcome published
    score = devset.score(results)
    assert (score.memory_agree, score.memory_total) == (2, 3)
    assert len(score.errors) == 2


def test_ranking_pairs_and_regret_by_hand():
    """Measured 10, 11, 20 s; predicted 9, 12, 8 s. Pairs: (10, 11) in order, (10, 20) and
    (11, 20) not: 1 of 3. The run predicted fastest (8 s) was measured 20 s: regret 20/10-1.
    A pair within 3% is a tie, not counted; a job of two runs is not ranked."""
    job = [result("a", 10, 9), result("a", 11, 12), result("a", 20, 8),
           result("a", 10.2, 10)]
    small = [result("b", 5, 1, job=("other",)), result("b", 50, 2, job=("other",))]
    rank = devset.score(job[:3] + small).ranking
    assert (rank.right, rank.pairs) == (1, 3) and rank.regrets == pytest.approx((1.0,))
    # 10.2 s (predicted 10) ties with 10 s; against 11 s it is in order, against 20 s not
    rank = devset.score(job).ranking
    assert (rank.right, rank.pairs) == (1 + 1, 3 + 2)


def test_a_source_a_profile_was_fitted_on_leaves_the_held_out_set():
    """The rule "compare only with sources that fitted nothing": a profile naming a source (or
    the whole file) moves every run of that source to the fitted side."""
    results = [result("a", 10, 9), result("a", 10, 9, fitted_on=("a",)), result("b", 10, 9)]
    held, fitted = split_dev(results)
    assert [r.run.source for r in held] == ["b"] and len(fitted) == 2
    held, fitted = split_dev([result("b", 10, 9, fitted_on=(devset.DEVSET_TABLE,))])
    assert held == [] and len(fitted) == 1
