"""The walk (``simulator/discrete_event/walk.py``): the engine's step in plain arithmetic equals
the SimPy run (``Engine.totals``, the oracle: every rank's finish, time by cause, exposed
communication by kind and peak activations, to float rounding), or is refused and the engine
runs it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from steady_helpers import REL, assert_same, llama

from clustersim.simulator.costs import compute
from clustersim.simulator.costs.memory import embedding_params_per_rank
from clustersim.simulator.discrete_event import walk
from clustersim.simulator.discrete_event.engine import Engine, simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.schedules import SCHEDULES
from clustersim.topologies.profile import profile_for_gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from engine_speed import GPT_1T_INTERLEAVED, simpy_only, table5_cases  # noqa: E402

from clustersim.simulator.inputs.scenario import load_scenario  # noqa: E402

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

# (schedule, chunks per rank) of every registered schedule
CHUNKS = {"gpipe": 1, "1f1b": 1, "zb-h1": 1, "zb-h2": 1, "interleaved": 2, "zb-v": 2,
          "dualpipev": 2, "dualpipe": 2, "combined-1f1b": 2}
# Overlapped forward-backward pairs (DualPipe, DualPipeV, combined 1F1B) are not walked; ZB-V's V
# turns mostly
# make two sends into one rank at one instant from ranks resumed at one instant, whose order
# SimPy takes from its event ids: refused then, walked otherwise.
NOT_WALKED = {"dualpipe", "dualpipev", "combined-1f1b"}
MAY_TIE = {"zb-v"}
FEATURES = {
    "no data parallelism": {},
    "ZeRO-1, reduction and gathers beside compute slowed by NCCL": {"dp": 2, "zero": 1},
    "ZeRO-0, reduction after the step": {"dp": 2, "zero": 0, "overlap_grad_reduce": False},
    "ZeRO-1, gathers after the step": {"dp": 2, "zero": 1, "overlap_param_gather": False},
    "ZeRO-2 under a pipeline": {"dp": 2, "zero": 2},
    "tp 2, sequence parallel, tp_comm_overlap": {"tp": 2, "sequence_parallel": True,
                                                 "tp_comm_overlap": True},
    "tp 8 across nodes, full recompute": {"tp": 8, "recompute": "full"},
    "MoE, expert parallel": {"dp": 2, "ep": 2, "sequence_parallel": True},
    "context parallel, ring attention's closed form": {"cp": 2, "dp": 2, "zero": 1},
}
# Stragglers as examples/stragglers-llama3-70b.yaml draws them (cluster.variability).
STRAGGLERS = {"variability": {"compute_sigma": 0.02, "slow_fraction": 0.001, "slow_factor": 1.5}}


def raw_of(name: str, feature: str, m: int = 16, pp: int = 4, cluster=None, **extra) -> dict:
    parallel = {"tp": 1, "dp": 1, **FEATURES[feature], "schedule": name, "pp": pp,
                "virtual_stages": CHUNKS[name], **extra}
    model = {"experts": 4, "top_k": 2} if "ep" in parallel else None
    return llama(m, model=model, cluster=cluster, **parallel)


def assert_same_totals(walked, simulated) -> None:
    """Every total equal to float rounding, and every rank's finish to the last bit: the walk
    computes times in the engine's arithmetic (which orders two sends called at one instant)."""
    assert len(walked) == len(simulated)
    assert [t.finish for t in walked] == [t.finish for t in simulated]
    for rank, (a, b) in enumerate(zip(walked, simulated, strict=True)):
        for field, x, y in zip(b._fields, a, b, strict=True):
            assert math.isclose(x, y, rel_tol=REL, abs_tol=1e-12), (rank, field, x, y)


def valid(raw: dict) -> bool:
    try:
        build_scenario(raw)
    except Exception:  # noqa: BLE001 - a schedule refusing a feature
        return False
    return True


CASES = [(n, f) for n in CHUNKS for f in FEATURES if valid(raw_of(n, f))]


@pytest.mark.parametrize(("name", "feature"), CASES)
def test_the_walk_equals_the_engine_or_is_refused(name, feature):
    s = build_scenario(raw_of(name, feature))
    walked = walk.walked_totals(Engine(s), rows=False)
    if name not in MAY_TIE:
        assert (walked is None) == (name in NOT_WALKED)
    if walked is not None:
        assert_same_totals(walked, Engine(s).totals())


@pytest.mark.parametrize("name", sorted(set(CHUNKS) - NOT_WALKED - MAY_TIE))
def test_stragglers_nccl_slowdown_and_odd_depths_are_walked_exactly(name):
    """Each stage its expected slowest GPU, compute slowed by a fifth beside NCCL kernels,
    three stages (first and last stage unlike the middle one)."""
    profile = profile_for_gpu("h100-sxm").model_copy(update={"comm_compute_slowdown": 0.2})
    pp = 3 if name != "interleaved" else 4
    raw = raw_of(name, "ZeRO-1, reduction and gathers beside compute slowed by NCCL",
                 m=24 if name != "interleaved" else 16, pp=pp, cluster=STRAGGLERS)
    raw["model"]["layers"] = 24
    s = build_scenario(raw)
    walked = walk.walked_totals(Engine(s, profile=profile), rows=False)
    assert walked is not None
    assert_same_totals(walked, Engine(s, profile=profile).totals())


@pytest.mark.parametrize("raw", [c[0] for c in table5_cases()[:4]],
                         ids=[c[0]["name"] for c in table5_cases()[:4]])
def test_korthikanti_table5_runs_are_walked_exactly(raw):
    """The 22B and 175B runs of Korthikanti et al. 2022, Table 5 (the benchmark's cases;
    the 530B and 1T ones take the engine seconds, benchmarks/engine_speed.py checks them)."""
    s = build_scenario(raw)
    walked = walk.walked_totals(Engine(s), rows=False)
    assert walked is not None
    assert_same_totals(walked, Engine(s).totals())
    assert_same(Engine(s).run(), simulate(s))


def test_two_sends_called_at_one_instant_go_in_simpys_order(monkeypatch):
    """The 1T model of Narayanan et al. 2021 interleaved on 64 stages, 6 replicas, 192
    micro-batches: stages 0 and 2 call their sends into stage 1 at one instant, resumed by
    events scheduled at different instants; the walk starts first the send of the rank
    resumed by the earlier-made event, as SimPy does, and the step is the engine's. The tie is
    a coincidence of the costs' floating-point values: the A100 profile's constants are
    pinned to those it had when the tie was found (2026-11-26), whatever the shipped ones, and
    the sends block, as they all did then (``overlap_p2p_comm`` false)."""
    s = build_scenario({**GPT_1T_INTERLEAVED, "parallel": {
        **GPT_1T_INTERLEAVED["parallel"], "overlap_p2p_comm": False}})
    profile = profile_for_gpu("a100-80gb").model_copy(
        update={"sustained_fraction": 0.784, "step_overhead_s": 0.0,
                "attention_efficiency": 0.73, "attention_backward_efficiency": 0.63,
                "attention_by_kernel": {"flash2": (0.73, 0.63)},
                "attention_overhead_tokens": (0.0, 0.0), "attention_overhead_by_kernel": {}})
    ties = []
    grant = walk._Walk._grant

    def counting(self, dst):
        called = [c[0] for c in self.calls[dst].values()]
        ties.extend(t for t in set(called) if called.count(t) > 1)
        grant(self, dst)

    monkeypatch.setattr(walk._Walk, "_grant", counting)
    walked = walk.walked_totals(Engine(s, microbatches=192, profile=profile), rows=False)
    assert ties and walked is not None
    assert_same_totals(walked, Engine(s, microbatches=192, profile=profile).totals())


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_shipped_example_simulates_as_with_simpy_alone(path):
    """``simulate`` on each example (what ``clustersim simulate`` runs) equals ``simulate``
    with every simulation run by SimPy, whether the walk gave it or refused it."""
    s = load_scenario(path)
    with simpy_only():
        simpy = simulate(s)
    assert_same(simpy, simulate(s))


def test_what_the_walk_does_not_model_is_refused():
    """ZeRO-3, full fidelity and a recorded timeline go to the engine."""
    zero3 = build_scenario(raw_of("1f1b", "no data parallelism", dp=2, zero=3))
    assert walk.walked_totals(Engine(zero3)) is None
    one_f_one_b = build_scenario(raw_of("1f1b", "no data parallelism"))
    assert walk.walked_totals(Engine(one_f_one_b, "full")) is None
    assert walk.walked_totals(Engine(one_f_one_b, record=True)) is None


def test_sends_called_at_one_instant_are_refused_and_simulate_runs_the_engine():
    """ZB-V on 4 stages: two stages send into one at the same instant, each resumed by an
    event scheduled at one same instant; the walk cannot say which SimPy starts first and
    refuses; ``simulate`` still gives the engine's answer."""
    s = build_scenario(raw_of("zb-v", "no data parallelism"))
    w = walk._Walk(Engine(s))
    with pytest.raises(walk.Undecided):
        w.run()
    assert_same(Engine(s).run(), simulate(s))


def test_every_registered_schedule_is_covered():
    assert set(CHUNKS) == set(SCHEDULES)


def test_end_chunks_holding_the_embedding_or_the_head_alone_are_walked_exactly():
    """Megatron-Core's --account-for-embedding/loss-in-pipeline-split: the first chunk runs
    only the embedding (a lookup, no time), the last only the output layer and loss; the walk
    and SimPy agree on the step they make."""
    raw = {"model": {"preset": "gpt-1.7b"}, "cluster": {"preset": "dgx-h100", "gpus": 32},
           "training": {"global_batch": 64, "micro_batch": 1},
           "parallel": {"tp": 2, "pp": 4, "schedule": "interleaved", "virtual_stages": 2,
                        "stage_layers": [0, 4, 4, 4, 4, 4, 4, 0]}}
    s = build_scenario(raw)
    engine = Engine(s)
    chunks = engine.costs.chunks
    assert chunks[0].forward == chunks[0].backward == 0.0
    assert chunks[0].whole.dense_params == embedding_params_per_rank(s.model, 2)
    head_forward, head_backward = compute.logits_times(engine.costs.stage(3))
    assert (chunks[-1].forward, chunks[-1].backward) == (head_forward, head_backward)
    walked = walk.walked_totals(engine, rows=False)
    assert walked is not None
    assert_same_totals(walked, Engine(s).totals())
