"""The harness's routing (validation/moe.py) against Megatron-Core's capacity rule: every
expert's buffer holds exactly ``ceil(T top_k / E x capacity_factor)`` rows, its
highest-scored tokens, the rest padding of probability 0; tokens past a full buffer are
dropped, and the ones kept are those the router scored highest."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from clustersim.validation.moe import MoE, ExpertParallel, ExpertShape, expert_capacity  # noqa: E402,I001

SHAPE = ExpertShape(hidden=16, ffn_hidden=32, experts=4, top_k=2, capacity_factor=1.0,
                    swiglu=True, layers=2)


@pytest.mark.parametrize("tokens, experts, top_k, factor", [
    (32, 4, 2, 1.0), (30, 8, 2, 1.25), (7, 4, 1, 1.0), (4, 2, 2, 4.0)])
def test_capacity_is_megatrons(tokens, experts, top_k, factor):
    shape = ExpertShape(16, 32, experts, top_k, factor, True, 2)
    megatron = math.ceil(tokens * top_k / experts * factor)  # get_capacity(T k, E, cf)
    assert expert_capacity(tokens, shape) == min(megatron, tokens)


def test_each_expert_keeps_its_best_routed_tokens_and_pads_the_rest():
    moe = MoE(SHAPE, ExpertParallel(), torch.Generator().manual_seed(0))
    tokens = torch.randn(24, SHAPE.hidden, generator=torch.Generator().manual_seed(1))
    slots, probs = moe._route(tokens)
    capacity = expert_capacity(24, SHAPE)
    assert slots.shape == probs.shape == (SHAPE.experts * capacity,)
    scores = torch.softmax(tokens @ moe.router.t(), dim=-1)
    top, chosen = scores.topk(SHAPE.top_k, dim=-1)
    for e in range(SHAPE.experts):
        mine = slice(e * capacity, (e + 1) * capacity)
        routed = [(scores[t, e].item(), t) for t in range(24) if e in chosen[t]]
        kept = sorted(routed, reverse=True)[:capacity]
        got = {int(t) for t, p in zip(slots[mine], probs[mine], strict=True) if p > 0}
        assert got == {t for _, t in kept}  # the best routed tokens, no others
        assert sorted(probs[mine][probs[mine] > 0].tolist()) == pytest.approx(
            sorted(p for p, _ in kept))
    assert (probs == 0).any()  # some buffer is short of routed tokens, padded with weight 0


def test_a_dropped_token_gets_nothing_from_that_expert():
    """One expert scores every token highest: its buffer keeps C of them, and the MLP's
    output for the others is what their second expert gives alone."""
    shape = ExpertShape(16, 32, 4, 1, 1.0, False, 2)
    moe = MoE(shape, ExpertParallel(), torch.Generator().manual_seed(0))
    with torch.no_grad():
        moe.router.zero_()
        moe.router[0] = 1.0
    tokens = torch.rand(12, 16, generator=torch.Generator().manual_seed(2)) + 0.1
    out = moe(tokens.view(1, 12, 16)).view(12, 16)
    capacity = expert_capacity(12, shape)
    assert capacity == 3
    assert (out.abs().sum(dim=-1) > 0).sum() == capacity  # the rest dropped: a zero update
