"""The real-run harness: every split trains to the same losses as one process (the split must
not change the math), and a failing or hung rank ends the run with its name, never a hang."""

from __future__ import annotations

import dataclasses
import time
from functools import cache

import pytest

torch = pytest.importorskip("torch")

import rank_helpers  # noqa: E402

from clustersim.validation.launch import RankFailure, run_ranks  # noqa: E402
from clustersim.validation.model import GPTShape  # noqa: E402
from clustersim.validation.train import RunConfig, train  # noqa: E402

SHAPE = GPTShape(layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=256, ffn_kind="swiglu",
                 vocab=256, seq_len=32)


@cache
def reference_losses(global_microbatches: int, shape: GPTShape = SHAPE) -> tuple[float, ...]:
    """One process, the whole global batch as micro-batches, no parallelism."""
    cfg = RunConfig(shape, microbatches=global_microbatches)
    return tuple(run_ranks(train, 1, cfg, timeout=120)[0]["losses"])


@pytest.mark.parametrize("split", [
    {"dp": 2},
    {"tp": 2},
    {"tp": 2, "sequence_parallel": True},
    {"tp": 2, "shape": dataclasses.replace(SHAPE, kv_heads=1)},  # K/V head replicated
    {"pp": 2, "schedule": "gpipe"},
    {"pp": 2, "schedule": "1f1b"},
    {"pp": 2, "schedule": "interleaved", "virtual_stages": 2},
    {"pp": 2, "schedule": "interleaved", "virtual_stages": 2, "microbatches": 5},  # groups of 3
    {"pp": 2, "schedule": "zb-h1"},  # backward split into input and weight halves
    {"pp": 2, "schedule": "zb-h2"},
    {"pp": 2, "schedule": "zb-v", "virtual_stages": 2},  # chunks in a V: loss on rank 0
    {"pp": 2, "schedule": "dualpipev", "virtual_stages": 2},  # pairs run one after the other
    {"dp": 2, "zero": 1},
    {"dp": 2, "zero": 2},
    {"dp": 2, "zero": 3},
], ids=lambda split: "-".join(f"{k}{v}" if k != "shape" else f"kv{v.kv_heads}"
                             for k, v in split.items()))
def test_a_split_trains_exactly_like_one_process(split):
    assert_trains_like_one_process(RunConfig(**{"shape": SHAPE, **split}))


def assert_trains_like_one_process(cfg: RunConfig) -> None:
    results = run_ranks(train, cfg.world, cfg, timeout=120)
    losses = next(r["losses"] for r in results if r["last_stage"])
    expected = reference_losses(cfg.dp * cfg.microbatches, cfg.shape)
    assert losses == pytest.approx(expected, rel=1e-5)
    assert len(set(losses)) == cfg.steps  # the steps really differ: it trains


MOE = dataclasses.replace(SHAPE, ffn_hidden=128, experts=4, top_k=2)  # 16 slots an expert


@pytest.mark.parametrize("split", [
    {"dp": 2, "ep": 2},  # two experts a rank, tokens exchanged by all-to-all
    {"dp": 2},  # every expert on both ranks
    {"dp": 2, "ep": 2, "shape": dataclasses.replace(MOE, ffn_kind="gelu")},
    {"pp": 2, "schedule": "1f1b"},
    {"pp": 2, "dp": 2, "ep": 2},  # experts' gradients reduced by hand after the schedule
], ids=lambda split: "-".join(f"{k}{v}" if k != "shape" else v.ffn_kind
                             for k, v in split.items()))
def test_experts_spread_over_ranks_train_exactly_like_one_process(split):
    """Each rank routes its own micro-batch to padded expert buffers, so where the experts
    sit changes no token's route: the losses are the single process's."""
    assert_trains_like_one_process(RunConfig(**{"shape": MOE, **split}))


# Capacity for every token (4 experts, top-2, factor 2): however the tokens are shared out,
# none is dropped, so a rank routing its part of the sequence routes as one process does.
MOE_ROOMY = dataclasses.replace(MOE, capacity_factor=2.0)


@pytest.mark.parametrize("split", [
    {"tp": 2},  # each expert's matrices split over two ranks, the tokens gathered to them
    {"tp": 2, "dp": 2, "ep": 2},  # spread over EP 2 too: all-to-all, then the TP gather
    {"tp": 2, "pp": 2, "schedule": "1f1b"},
    {"tp": 2, "expert_tp": 1},  # folded: whole experts, each rank routing its own tokens
    {"tp": 2, "expert_tp": 1, "ep": 2},  # the EP group drawn from the TP ranks
    {"tp": 2, "expert_tp": 1, "dp": 2, "ep": 4},  # ... from all of a stage's TP x DP ranks
], ids=lambda split: "-".join(f"{k}{v}" for k, v in split.items()))
def test_experts_split_over_tensor_parallel_ranks_train_exactly_like_one_process(split):
    """Experts under TP (with sequence parallelism, as Megatron-Core requires) split like the
    dense MLP, or kept whole with the EP group folded over the TP ranks: the losses are the
    single process's."""
    assert_trains_like_one_process(RunConfig(**{"shape": MOE_ROOMY, "sequence_parallel": True,
                                                **split}))


MLA = dataclasses.replace(SHAPE, kv_heads=4, q_lora_rank=32, kv_lora_rank=32,
                          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


@pytest.mark.parametrize("split", [
    {"dp": 2},
    {"pp": 2, "schedule": "1f1b"},
    {"dp": 2, "shape": dataclasses.replace(MLA, q_lora_rank=None)},  # one query projection
    {"tp": 2},  # the heads split, the latents whole on each rank
    {"tp": 2, "sequence_parallel": True},  # the latents and the RoPE key gathered
    {"tp": 2, "sequence_parallel": True, "shape": dataclasses.replace(MLA, q_lora_rank=None)},
    {"dp": 2, "ep": 2, "shape": dataclasses.replace(MOE, kv_heads=4, q_lora_rank=32,
                                                    kv_lora_rank=32, qk_nope_head_dim=16,
                                                    qk_rope_head_dim=8, v_head_dim=16)},
], ids=["dp2", "pp2", "dp2-no-query-latent", "tp2", "tp2-sp", "tp2-sp-no-query-latent",
        "dp2-ep2-moe"])
def test_latent_attention_trains_exactly_like_one_process(split):
    assert_trains_like_one_process(RunConfig(**{"shape": MLA, **split}))


def test_a_zero_sharded_optimizer_with_spread_experts_is_refused():
    with pytest.raises(RankFailure, match="zero 0 with ep > 1"):
        run_ranks(train, 2, RunConfig(MOE, dp=2, ep=2, zero=1), timeout=60)


def test_the_steps_update_the_weights():
    """A check on the oracle itself: with lr = 0 only the first step's loss is the same, so
    matching losses over several steps means matching optimizer updates too."""
    frozen = run_ranks(train, 1, dataclasses.replace(RunConfig(SHAPE), lr=0.0), timeout=120)
    trained = reference_losses(RunConfig(SHAPE).microbatches)
    assert frozen[0]["losses"][0] == pytest.approx(trained[0], rel=1e-6)
    assert all(abs(a - b) > 1e-4 for a, b in zip(frozen[0]["losses"][1:], trained[1:],
                                                   strict=True))


def test_bf16_autocast_trains_like_fp32_within_bf16_rounding():
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-8 = 0.4%): the losses follow the fp32
    # run to within a few roundings, and differ from it, so the GEMMs really ran in bf16.
    cfg = RunConfig(SHAPE, precision="bf16")
    bf16 = run_ranks(train, 1, cfg, timeout=120)[0]["losses"]
    fp32 = reference_losses(cfg.microbatches)
    assert bf16 == pytest.approx(fp32, rel=3e-2)
    assert bf16 != pytest.approx(fp32, rel=1e-6)


def test_results_come_back_in_rank_order():
    assert run_ranks(rank_helpers.echo, 2, timeout=60) == [1, 1]


@pytest.mark.parametrize("fn, says", [(rank_helpers.dies, "died (exit code 3)"),
                                      (rank_helpers.raises, "ValueError: bad shard")])
def test_a_failing_rank_is_named(fn, says):
    with pytest.raises(RankFailure, match="rank 1") as info:
        run_ranks(fn, 2, timeout=60)
    assert info.value.rank == 1 and says in str(info.value)


def test_a_hung_run_times_out():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="timed out after 5 s"):
        run_ranks(rank_helpers.hangs, 2, timeout=5)
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("split", [
    {"cp": 2, "cp_comm": "p2p"},  # ring attention, K/V blocks passed round
    {"cp": 2, "cp_comm": "allgather"},
    {"cp": 2, "cp_comm": "a2a"},  # Ulysses: heads traded for the sequence
    {"cp": 4, "cp_comm": "p2p"},  # earlier and later ranks' blocks, gradients carried on
    {"cp": 4, "cp_comm": "allgather"},
    {"cp": 2, "dp": 2},  # gradients averaged over DP x CP
    {"cp": 2, "tp": 2, "sequence_parallel": True},  # each CP part split again over TP
    {"cp": 2, "pp": 2, "schedule": "1f1b"},
    {"cp": 2, "dp": 2, "zero": 1},
], ids=lambda split: "-".join(f"{k}{v}" for k, v in split.items()))
def test_context_parallel_splits_train_exactly_like_one_process(split):
    """Each CP rank holds two of the 2 cp chunks of every sequence and reaches the rest
    through its exchange: the losses are the single process's."""
    assert_trains_like_one_process(RunConfig(**{"shape": SHAPE, **split}))
