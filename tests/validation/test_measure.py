"""What real runs measure, against the simulator's closed forms: 16 bytes of model state per
parameter (fp32 Adam), ZeRO's shards, and activations held by min(p - stage, m) micro-batches
under 1F1B against m under GPipe."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from clustersim.validation.launch import run_ranks  # noqa: E402
from clustersim.validation.measure import step_statistics  # noqa: E402
from clustersim.validation.model import GPTShape  # noqa: E402
from clustersim.validation.train import RunConfig, train  # noqa: E402

SHAPE = GPTShape(layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, ffn_kind="gelu",
                 vocab=256, seq_len=32)


def memory(**split) -> list[dict]:
    cfg = RunConfig(SHAPE, steps=2, **split)
    results = run_ranks(train, cfg.world, cfg, timeout=120)
    return [r["memory"] for r in sorted(results, key=lambda r: r["rank"])]


def test_model_states_are_16_bytes_per_parameter_and_zero_shards_them():
    """fp32 AdamW: 4 (weights) + 4 (gradients) + 8 (two moments) bytes per parameter; ZeRO-1
    splits the moments over the replicas, ZeRO-3 splits all three (Rajbhandari et al. 2020)."""
    (single,) = memory()
    params = single["params"] / 4
    assert single["grads"] == single["params"]
    assert single["optimizer"] == pytest.approx(8 * params, rel=0.01)  # + Adam's step counters
    zero1 = memory(dp=2, zero=1)
    assert [z["params"] for z in zero1] == [single["params"]] * 2
    assert sum(z["optimizer"] for z in zero1) == pytest.approx(single["optimizer"], rel=0.01)
    assert max(z["optimizer"] for z in zero1) < 0.6 * single["optimizer"]
    zero3 = memory(dp=2, zero=3)
    for part in ("params", "grads", "optimizer"):
        assert sum(z[part] for z in zero3) == pytest.approx(single[part], rel=0.01)
        assert max(z[part] for z in zero3) < 0.55 * single[part]


def test_1f1b_holds_p_minus_stage_microbatches_gpipe_holds_all():
    one_f_one_b = memory(pp=2, microbatches=8)
    gpipe = memory(pp=2, microbatches=8, schedule="gpipe")
    for stage in (0, 1):
        ratio = one_f_one_b[stage]["activations"] / gpipe[stage]["activations"]
        assert ratio == pytest.approx(min(2 - stage, 8) / 8, rel=0.02), stage


def test_step_statistics_drop_the_warmup():
    stats = step_statistics([5.0, 1.0, 3.0, 2.0])
    assert stats == {"step_time_s": 2.0, "step_time_spread_s": 2.0, "steps_timed": 3}
