"""Scenarios and comparisons shared by the steady-state shortcut's tests (``steady.py``)."""

from __future__ import annotations

import math

from clustersim.simulator.discrete_event import steady
from clustersim.simulator.discrete_event.engine import Engine
from clustersim.simulator.inputs.scenario import build_scenario

REL = 1e-9  # the shortcut's promise: equal to the whole simulation up to float rounding

# Features every steady-state shortcut is tested under (test_steady_schedules, test_periodic).
FEATURES = {
    "no data parallelism": {},
    "tp 2, dp 2, ZeRO-1 reduction and gather overlapped": {"tp": 2, "dp": 2, "zero": 1},
    "dp 2, ZeRO-2, reduction after the step": {"dp": 2, "zero": 2, "overlap_grad_reduce": False},
    "tp 2, sequence parallel, tp_comm_overlap": {"tp": 2, "sequence_parallel": True,
                                                 "tp_comm_overlap": True},
}
# Stragglers as examples/stragglers-llama3-70b.yaml draws them (cluster.variability).
STRAGGLERS = {"variability": {"compute_sigma": 0.02, "slow_fraction": 0.001, "slow_factor": 1.5}}


def llama(micro_batches: int, model=None, training=None, cluster=None, **parallel) -> dict:
    """A shortened Llama 3 8B on DGX H100 nodes, real links and the shipped H100 profile."""
    p = {"tp": 2, "pp": 4, "dp": 2, "schedule": "1f1b", **parallel}
    gpus = p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1)
    return {
        "model": {"preset": "llama3-8b", "layers": 16, "seq_len": 2048, **(model or {})},
        "cluster": {"preset": "dgx-h100", "gpus": gpus, **(cluster or {})},
        "training": {"global_batch": micro_batches * p["dp"], "micro_batch": 1,
                     **(training or {})},
        "parallel": p,
    }


def full_and_shortcut(raw: dict, fidelity: str = "representative", profile=None):
    """(the whole simulation, the step extended from three short ones) of ``raw``; fails if
    the shortcut was not taken."""
    s = build_scenario(raw)
    whole = Engine(s, fidelity, profile).run()
    extended = steady.extrapolated(
        s, lambda m: Engine(s, fidelity, profile, microbatches=m).totals())
    assert extended is not None, "the shortcut was not taken"
    return whole, Engine(s, fidelity, profile).result(extended)


def assert_same(whole, fast) -> None:
    """Every field of the two results' JSON form (step time, breakdown, per-stage memory and
    time by cause, throughput) equal, numbers to ``REL``."""
    _same(fast.to_json(), whole.to_json(), "result")


def _same(a, b, where: str) -> None:
    if isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in b:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(b, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and not isinstance(a, bool):
        assert math.isclose(a, b, rel_tol=REL, abs_tol=1e-12), f"{where}: {a} != {b}"
    else:
        assert a == b, where
