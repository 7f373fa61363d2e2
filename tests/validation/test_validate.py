"""``clustersim calibrate`` and ``clustersim validate`` end to end on gloo, and their bad input.

The oracle for memory is the real run itself: the simulator's memory model (16 bytes per
parameter, Korthikanti's activations, the stage split) must match the bytes the ranks hold,
for DP, TP and PP. Step time on a tiny model is dominated by overheads the cost model does
not claim to capture, so here it is only checked to be measured and compared; the README's
table holds the accuracy measured on the ~60M model.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from clustersim.cli import main  # noqa: E402
from clustersim.errors import ScenarioError  # noqa: E402
from clustersim.simulator.inputs.scenario import build_scenario, load_scenario  # noqa: E402
from clustersim.topologies.profile import load_profile  # noqa: E402
from clustersim.validation.shrink import shrink  # noqa: E402

TINY = """\
name: tiny
model: {layers: 4, hidden: 64, heads: 4, vocab: 256, seq_len: 32, bias: false,
        tie_embeddings: false}
cluster: {preset: localhost-gloo, gpus: 2}
training: {global_batch: 8, micro_batch: 1, precision: fp32}
parallel: {tp: 1, pp: 1, dp: 2}
"""


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON (RFC 8259 sec. 6)")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "cpu.json"
    assert main(["calibrate", "--quick", "--out", str(out)]) == 0
    return out


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_calibrate_writes_a_loadable_profile_and_its_raw_numbers(profile):
    p = load_profile(profile)
    assert p.gpu == "cpu-core" and p.matmul_efficiency_by_tokens
    assert 0 < p.comm_eff("intra_node") <= 1 and p.comm_latency_s["intra_node"] > 0
    raw = profile.with_name("cpu.raw.csv").read_text().splitlines()
    assert raw[0].startswith("kind,op") and len(raw) > 20
    assert "reduce_scatter" not in "".join(raw)  # gloo emulates it: never calibrated from


@pytest.mark.parametrize("split", [[], ["--set", "parallel.dp=1", "--set", "parallel.tp=2"],
                                   ["--set", "parallel.dp=1", "--set", "parallel.pp=2"],
                                   # 5 micro-batches on 2 stages: Megatron-LM's groups of 3
                                   ["--set", "parallel.dp=1", "--set", "parallel.pp=2",
                                    "--set", "parallel.schedule=interleaved",
                                    "--set", "parallel.virtual_stages=2",
                                    "--set", "training.global_batch=5"],
                                   # Qwen3-style heads: 4 of 32 over a hidden size of 64
                                   ["--set", "parallel.dp=1", "--set", "parallel.tp=2",
                                    "--set", "model.head_dim=32"]],
                         ids=["dp2", "tp2", "pp2", "pp2-interleaved-m5", "tp2-head-dim"])
def test_validate_measures_the_memory_the_model_predicts(profile, tiny, tmp_path, capsys,
                                                         split):
    out = tmp_path / "measured"
    assert main(["validate", str(tiny), "--profile", str(profile), "--steps", "3", "--json",
                 "--out", str(out), *split]) == 0
    report = json.loads(capsys.readouterr().out, parse_constant=_not_json)  # strict JSON
    assert report["backend"] == "gloo" and report["nproc"] == 2
    assert report["measured"]["step_time_s"] > 0
    assert report["error"]["step_time"] == pytest.approx(
        report["predicted"]["step_time_s"] / report["measured"]["step_time_s"] - 1)
    assert abs(report["error"]["peak_bytes"]) < 0.05
    assert build_scenario(report["scenario"]).parallel.dp == (1 if split else 2)
    steps = (out / "steps.csv").read_text().splitlines()
    assert len(steps) == 1 + 2 * 3  # a row per rank and step
    assert {"forward_s", "backward_s", "optimizer_s", "activations_bytes"} <= set(
        steps[0].split(","))
    phases = report["measured"]["phases_s"]  # they account for the step (all but zero_grad)
    # The tiny model's step lasts ~30 ms, so a rank descheduled on a loaded 2-core machine
    # leaves gaps between phases that no phase counts: the lower bound allows for them. A
    # pipeline rank also waits for its peer's sends (gloo's ~1 ms a message, about a
    # micro-batch's compute here) and through the bubble, which no phase counts either
    # (0.45 of the step measured under load, 2026-11-29).
    lowest = 0.3 if "parallel.pp=2" in split else 0.5
    assert lowest < sum(phases.values()) / report["measured"]["step_time_s"] < 1.1
    assert phases["forward"] > 0 and phases["backward"] > 0
    assert json.loads((out / "validate.json").read_text())["per_rank"]
    assert report["profile"] == {"name": "cpu-core-calibrated", "file": str(profile),
                                 "quick": True}  # named, a quick profile is used, and said so


def test_the_memory_wider_heads_add_is_what_the_real_run_adds(profile, tiny, capsys):
    """Heads of their own width (``model.head_dim``, Qwen3's) widen Q, the attention output and
    the projections around them: from 4 heads of 16 to 4 of 64 over a hidden size of 64, the
    predicted peak grows by what the two-rank TP run's grows (measured 2026-11-29: 1,769,472
    bytes, both)."""
    peaks = []
    for head_dim in (16, 64):
        assert main(["validate", str(tiny), "--profile", str(profile), "--steps", "2", "--json",
                     "--set", "parallel.dp=1", "--set", "parallel.tp=2",
                     "--set", f"model.head_dim={head_dim}"]) == 0
        report = json.loads(capsys.readouterr().out)
        peaks.append((report["predicted"]["peak_bytes"], report["measured"]["peak_bytes"]))
    (predicted_16, measured_16), (predicted_64, measured_64) = peaks
    assert measured_64 > measured_16
    assert predicted_64 - predicted_16 == pytest.approx(measured_64 - measured_16, rel=0.02)


def test_validate_passes_over_a_quick_calibration_by_default(profile, tiny, tmp_path,
                                                             monkeypatch, capsys):
    """Issue 24: the newest user calibration was a --quick one, and validate picked it. Now the
    shipped profile is used and the line says the quick one was passed over."""
    monkeypatch.setenv("CLUSTERSIM_DATA_DIR", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-core-20991231-235959.json").write_bytes(profile.read_bytes())
    assert main(["validate", str(tiny), "--steps", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    used = json.loads(out)["profile"]
    assert used["file"].endswith("topologies/profiles/cpu-core.json") and not used["quick"]
    assert "1 newer --quick calibration passed over" in err


def test_shrinking_keeps_the_split_and_caps_the_model():
    s = load_scenario("examples/llama3-70b-h100.yaml", ["parallel.tp=2", "parallel.pp=2",
                                                        "parallel.virtual_stages=1",
                                                        "parallel.schedule=1f1b"])
    small, notes = shrink(s, "gloo", 4)
    p = small.parallel
    assert (p.tp, p.pp, p.dp, p.zero) == (2, 2, 1, s.parallel.zero)
    assert small.model.hidden == 512 and small.model.layers <= 16
    assert small.model.heads // small.model.kv_heads == s.model.heads // s.model.kv_heads
    assert small.cluster.gpu.id == "cpu-core" and small.cluster.gpus == 4
    assert any(n.startswith("model:") for n in notes)


def test_the_real_run_predicts_the_optimizer_state_the_harness_keeps():
    """The harness trains with torch.optim.AdamW over fp32 parameters: a scenario's 16-bit
    moments or remainder master (DeepSeek-V3's, NeMo's) are not what it measures, so the
    shrunk scenario predicts fp32 moments and the parameters as the master."""
    s = load_scenario("examples/llama3-70b-h100.yaml", [
        "parallel.tp=2", "parallel.pp=1", "parallel.virtual_stages=1",
        "training.optimizer_moments=bf16", "training.master_weights=remainders"])
    small, _ = shrink(s, "gloo", 2)
    assert (small.training.optimizer_moments, small.training.master_weights) == ("fp32", "params")


def test_the_real_run_shards_over_every_replica_and_says_so():
    """The harness's ZeRO (its FSDP) has no hybrid sharding: a dp_shard that would not divide
    the shrunk dp is dropped, with a note, rather than refused."""
    s = load_scenario("examples/llama3-70b-h100.yaml", [
        "parallel.tp=2", "parallel.pp=1", "parallel.virtual_stages=1", "parallel.zero=1",
        "parallel.dp_shard=8"])
    small, notes = shrink(s, "gloo", 2)
    assert small.parallel.dp_shard is None
    assert any(n.startswith("parallel.dp_shard: 8 -> null") for n in notes)


@pytest.mark.parametrize("args, field", [
    (["--backend", "nccl"], "--backend"),
    (["--steps", "1"], "--steps"),
    (["--set", "parallel.tp=2", "--set", "parallel.dp=1", "--nproc", "3"], "--nproc"),
    (["--set", "parallel.cp=2", "--set", "parallel.dp=1", "--set", "parallel.cp_comm=a2a+p2p"],
     "parallel.cp_comm"),  # the hierarchical exchange is not built
    (["--profile", "/nonexistent/p.json"], "--profile"),
    (["--profile", "h100-sxm"], "--profile: h100-sxm was measured on h100-sxm, not on the "
                                "cluster's GPU cpu-core"),  # gloo runs on CPU cores
    (["--set", "parallel.dp=1", "--set", "parallel.pp=2", "--set", "parallel.schedule=dualpipe",
      "--set", "parallel.virtual_stages=2"], "parallel.schedule"),  # two model copies
])
def test_validate_bad_input_is_one_error_line(profile, tiny, capsys, args, field):
    if "--profile" not in args:
        args = [*args, "--profile", str(profile)]
    assert main(["validate", str(tiny), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}"), err


@pytest.mark.parametrize("args, field", [
    (["--backend", "nccl"], "--backend"),
    (["--nproc", "0"], "--nproc"),
    (["--out", "/nonexistent/dir/p.json"], "--out"),
    (["--out", "profile.yaml"], "--out"),
])
def test_calibrate_bad_input_is_one_error_line(capsys, args, field):
    assert main(["calibrate", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}"), err


@pytest.mark.parametrize("sets, field", [
    (["parallel.tp=1"], "parallel.zero"),  # ZeRO-1 would shard the ranks' own experts
])
def test_shrink_refuses_what_the_harness_cannot_run(sets, field):
    s = load_scenario("examples/mixtral-8x7b-h100.yaml", sets)
    with pytest.raises(ScenarioError, match=f"^{field}: the real-run harness"):
        shrink(s, "gloo", 2)


def test_shrinking_folded_experts_draws_their_ep_from_the_tp_ranks():
    """MoE parallel folding (``expert_tp`` 1): the EP group is carved out of a stage's TP x DP
    ranks, so on two ranks at TP 2 the experts still spread over both; ZeRO over the one
    replica shards nothing and is not refused."""
    s = load_scenario("examples/mixtral-8x7b-h100.yaml", ["parallel.expert_tp=1"])
    small, notes = shrink(s, "gloo", 2)
    p = small.parallel
    assert (p.tp, p.dp, p.ep, p.expert_tp) == (2, 1, 2, 1)
    assert "parallel.ep: 8 -> 2 (of tp x dp 2)" in notes


def test_shrinking_an_moe_keeps_its_experts_over_the_ranks_there_are():
    s = load_scenario("examples/mixtral-8x7b-dropless-h100.yaml", [
        "parallel.tp=1", "parallel.zero=0", "parallel.sequence_parallel=false"])
    small, notes = shrink(s, "gloo", 2)
    assert (small.model.experts, small.model.top_k) == (8, 2)
    assert (small.parallel.ep, small.parallel.dp) == (2, 2)
    assert small.model.capacity_factor == 1.0  # buffers padded to capacity, not dropless
    assert any(n.startswith(f"parallel.ep: {s.parallel.ep} -> 2") for n in notes)
    assert any("capacity_factor None -> 1.0" in n for n in notes)


@pytest.mark.parametrize("sets", [
    ["parallel.ep=2"], ["parallel.ep=1"],
    ["parallel.ep=1", "parallel.dp=1", "parallel.tp=2", "parallel.sequence_parallel=true",
     "training.global_batch=8"],
    ["parallel.ep=2", "parallel.expert_tp=1", "parallel.dp=1", "parallel.tp=2",
     "parallel.sequence_parallel=true", "training.global_batch=8"]],
    ids=["ep2", "ep1", "tp2", "tp2-folded-ep2"])
def test_validate_measures_the_memory_an_moe_keeps(profile, capsys, sets):
    """Routed tokens, their probabilities, the experts' MLP inputs: the model's MoE
    activations (``activations._moe_tensors``) are what the real run saves, with the experts
    spread over both ranks (measured 2026-11-29: +0.7%), on each (+0.5%), split over two
    TP ranks, the routed tokens gathered to both (+0.7%), or whole and spread over the TP
    ranks (folded, +0.7%)."""
    assert main(["validate", "examples/validate-moe-60m.yaml", "--profile", str(profile),
                 "--steps", "2", "--json", *(x for kv in sets for x in ("--set", kv))]) == 0
    report = json.loads(capsys.readouterr().out)
    p = build_scenario(report["scenario"]).parallel
    assert f"parallel.ep={p.ep}" in sets and f"parallel.tp={p.tp}" in [*sets, "parallel.tp=1"]
    assert abs(report["error"]["peak_bytes"]) < 0.02


MLA = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 64, "bias": False,
       "tie_embeddings": False, "q_lora_rank": 128, "kv_lora_rank": 64,
       "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64}


def test_shrink_keeps_latent_attention_and_its_split():
    """The harness builds MLA (validation/latent.py), its heads split under TP; the values are
    widened to the keys' width, which the CPU's fused attention needs (the change is said).
    Under context parallelism it is refused, not run as standard attention."""
    raw = {"model": MLA, "cluster": {"preset": "localhost-gloo", "gpus": 2},
           "training": {"global_batch": 8, "precision": "fp32"}, "parallel": {"dp": 2}}
    small, notes = shrink(build_scenario(raw), "gloo", 2)
    assert (small.model.kv_lora_rank, small.model.q_lora_rank) == (64, 128)
    assert small.model.v_head_dim == 96 and any("v_head_dim 64 -> 96" in n for n in notes)
    raw["parallel"] = {"tp": 2, "dp": 1}
    small, _ = shrink(build_scenario(raw), "gloo", 2)
    assert (small.model.kv_lora_rank, small.parallel.tp) == (64, 2)
    raw["parallel"] = {"cp": 2, "dp": 1}
    with pytest.raises(ScenarioError, match="parallel.cp: the real-run harness runs experts and "
                                            "latent attention without context parallelism"):
        shrink(build_scenario(raw), "gloo", 2)


def test_validate_measures_the_memory_latent_attention_keeps(profile, tmp_path, capsys):
    """MLA's latents, each as its norm's input and its up-projection's, and the per-head Q, K
    and V the attention kernel keeps (``activations._attention_tensors``): measured
    2026-11-29 within 1% on DP 2 and PP 2, and on TP 2 without and with sequence parallelism
    (+0.6%, -0.1%)."""
    path = tmp_path / "mla.yaml"
    path.write_text(json.dumps({"name": "mla", "model": MLA,
                                "cluster": {"preset": "localhost-gloo", "gpus": 2},
                                "training": {"global_batch": 8, "precision": "fp32"},
                                "parallel": {"dp": 2}}))
    tp = ["--set", "parallel.dp=1", "--set", "parallel.tp=2"]
    for split in ([], ["--set", "parallel.dp=1", "--set", "parallel.pp=2"], tp,
                  [*tp, "--set", "parallel.sequence_parallel=true"]):
        assert main(["validate", str(path), "--profile", str(profile), "--steps", "2",
                     "--json", *split]) == 0
        report = json.loads(capsys.readouterr().out)
        assert abs(report["error"]["peak_bytes"]) < 0.02


def test_shrink_keeps_a_zero_bubble_schedule_for_the_real_run():
    """The harness runs split backwards (tests/validation/test_harness.py), so ZB-H1 stays."""
    s = load_scenario("examples/validate-gpt-60m.yaml", ["parallel.dp=1", "parallel.pp=2",
                                                        "parallel.schedule=zb-h1",
                                                        "training.global_batch=8"])
    shrunk, _ = shrink(s, "gloo", 2)
    assert shrunk.parallel.schedule == "zb-h1" and shrunk.parallel.pp == 2


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_shrink_keeps_a_v_placed_schedule_for_the_real_run(schedule):
    """The harness places chunks as the schedule does and hands the V's turn over locally
    (tests/validation/test_harness.py), so ZB-V and DualPipeV stay."""
    s = load_scenario("examples/validate-gpt-60m.yaml", [
        "parallel.dp=1", "parallel.pp=2", f"parallel.schedule={schedule}",
        "parallel.virtual_stages=2", "training.global_batch=8"])
    shrunk, _ = shrink(s, "gloo", 2)
    assert shrunk.parallel.schedule == schedule and shrunk.parallel.virtual_stages == 2


@pytest.mark.parametrize(("asked", "backend", "runs"), [
    ("bf16", "gloo", "fp32"), ("fp32", "nccl", "fp32"), ("bf16", "nccl", "bf16"),
    ("fp8", "nccl", "bf16"), ("fp16", "nccl", "bf16")])
def test_the_harness_trains_fp32_on_cpus_and_bf16_autocast_on_gpus(asked, backend, runs):
    from clustersim.validation.shrink import _harness_precision
    notes: list[str] = []
    assert _harness_precision(asked, backend, notes) == runs
    assert bool(notes) == (asked != runs)


def test_shrink_keeps_context_parallelism_and_its_exchange():
    """CP ranks come out of the ranks as TP's do: dp takes what is left; the sequence is cut
    so that each CP rank's two chunks split again over TP's sequence-parallel ranks."""
    raw = {"model": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 100},
           "cluster": {"preset": "localhost-gloo", "gpus": 4},
           "training": {"global_batch": 8, "precision": "fp32"},
           "parallel": {"tp": 2, "cp": 2, "cp_comm": "allgather", "sequence_parallel": True}}
    small, _ = shrink(build_scenario(raw), "gloo", 4)
    p = small.parallel
    assert (p.tp, p.cp, p.dp, p.cp_comm) == (2, 2, 1, "allgather")
    assert small.model.seq_len == 96  # 100 cut to a multiple of tp x 2 cp = 8


@pytest.mark.parametrize("sets, backend, field", [
    (["parallel.cp=2", "parallel.dp=1"], "nccl", "parallel.cp"),  # its blocks: CPU kernels
    (["parallel.cp=2", "parallel.dp=1", "parallel.cp_comm=a2a+p2p"], "gloo", "parallel.cp_comm"),
])
def test_shrink_refuses_the_context_parallelism_the_harness_cannot_run(sets, backend, field):
    s = load_scenario("examples/validate-gpt-60m.yaml", sets)
    with pytest.raises(ScenarioError, match=f"^{field}: .*the real-run harness"):
        shrink(s, backend, 2)


def test_shrink_refuses_experts_under_context_parallelism():
    s = load_scenario("examples/validate-moe-60m.yaml", ["parallel.cp=2", "parallel.dp=1",
                                                         "parallel.ep=1"])
    with pytest.raises(ScenarioError, match="^parallel.cp: the real-run harness runs experts"):
        shrink(s, "gloo", 2)


@pytest.mark.parametrize("comm", ["p2p", "allgather", "a2a"])
def test_validate_measures_the_memory_context_parallelism_keeps(profile, tiny, capsys, comm):
    """Each CP rank keeps the activations of its s/cp tokens; what the exchanges bring in (K/V
    blocks, gathered K/V, the all-to-alls' outputs) is gone when the attention returns or
    stands in for what the rank would have kept anyway (measured 2026-11-29: +0.75%, +0.75%,
    +0.24%)."""
    assert main(["validate", str(tiny), "--profile", str(profile), "--steps", "2", "--json",
                 "--set", "parallel.dp=1", "--set", "parallel.cp=2",
                 "--set", f"parallel.cp_comm={comm}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert build_scenario(report["scenario"]).parallel.cp == 2
    assert abs(report["error"]["peak_bytes"]) < 0.02


def test_validate_names_the_context_parallel_split_it_ran(profile, tiny, capsys):
    assert main(["validate", str(tiny), "--profile", str(profile), "--steps", "2",
                 "--set", "parallel.dp=1", "--set", "parallel.cp=2",
                 "--set", "parallel.cp_comm=allgather"]) == 0
    assert "tp=1 cp=2 (allgather) pp=1 dp=1" in capsys.readouterr().out
