"""One label names a split everywhere (plan, sweep, report, plots): splits that differ in any
dimension — expert and context parallelism included — never share a label."""

from __future__ import annotations

from clustersim.reports.labels import config_label, split_columns
from clustersim.reports.plan import PlanRequest, plan

SPLIT_KEYS = ("gpus", "tp", "pp", "dp", "cp", "cp_comm", "ep", "micro_batch", "schedule",
              "virtual_stages", "zero", "recompute", "sequence_parallel")


def test_mixtral_plans_differing_only_in_ep_have_different_labels():
    req = PlanRequest(model={"preset": "mixtral-8x7b", "seq_len": 4096},
                      cluster={"preset": "dgx-h100", "gpus": 16}, global_batch=64)
    plans, _, _ = plan(req, top=30)
    splits = [split_columns(p.scenario) for p in plans]
    labels = {}
    for split in splits:
        labels.setdefault(config_label(split), set()).add(tuple(split[k] for k in SPLIT_KEYS))
    assert all(len(same) == 1 for same in labels.values()), labels
    with_ep = [s for s in splits if s["ep"] > 1]
    assert with_ep, "a Mixtral plan on 16 GPUs should use expert parallelism"
    for split in with_ep:  # ep8, or ep8-etp1 where the experts fold over the TP ranks
        etp = f"-etp{split['expert_tp']}" if "expert_tp" in split else ""
        assert f"ep{split['ep']}{etp}" in config_label(split).split()


def test_label_names_gpus_cp_ep_and_sequence_parallel_and_omits_ones():
    row = {"gpus": 512, "tp": 8, "pp": 4, "dp": 8, "cp": 2, "ep": 1, "micro_batch": 1,
           "schedule": "interleaved", "virtual_stages": 5, "zero": 1, "recompute": "selective",
           "sequence_parallel": True}
    assert config_label(row) == "512 GPUs: tp8+sp pp4 dp8 cp2 mb1 interleaved×5 z1 selective"
    old_table_row = {k: v for k, v in row.items() if k not in ("cp", "ep", "sequence_parallel")}
    assert config_label(old_table_row) == "512 GPUs: tp8 pp4 dp8 mb1 interleaved×5 z1 selective"
    ulysses = {**row, "cp_comm": "a2a", "ep": 4}  # how the cp ranks share K and V, before ep
    assert config_label(ulysses).split()[5:7] == ["cp2-a2a", "ep4"]
    assert "cp_comm" not in config_label({**row, "cp": 1, "cp_comm": None})


def test_hybrid_sharding_reads_in_the_label_and_plain_zero_does_not():
    """``z3-shard8``: ZeRO-3 over copies of 8 ranks; a CSV's empty cell (NaN) reads as plain."""
    row = {"gpus": 64, "tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "schedule": "1f1b",
           "virtual_stages": 1, "zero": 3, "recompute": "none"}
    assert config_label({**row, "dp_shard": 8}).endswith(" z3-shard8 none")
    assert config_label({**row, "dp_shard": float("nan")}).endswith(" z3 none")
