"""The development set: published runs with 3D parallelism, each turned into scenarios and scored.

``tests/data/published-dev.yaml`` holds 151 published runs (vTrain's multi-node
Megatron-DeepSpeed runs on A100, BLOOM's topology sweep and production run on Jean Zay,
Korthikanti et al. 2022's end-to-end runs on Selene) as facts: the model, the split, the
hardware, what was measured, and null for what a source did not publish. These rules make a run
a scenario; they are the rules of ``../shared/validation/devset.py``
(tests/validation/test_devset.py checks that both give the
same scenarios), so the scores match that script's exactly:

- the cluster preset follows the GPU (A100 40 GB -> dgx-a100-40gb, any other A100 ->
  dgx-a100-80gb); where a source documents a slower network than a DGX,
  ``cluster.inter_node.bandwidth`` is set to it (``INTER_NODE_GBPS``);
- runs from before FlashAttention (all three sources) set ``training.flash_attention: false``;
- documented software settings are kept: vTrain's configs disable gradient bucketing
  (``parallel.overlap_grad_reduce: false``);
- a setting a source did not publish (recomputation) is simulated over its candidates and the run
  is scored on the fastest candidate that fits in memory, as a tuned production run would have
  been; selective recomputation did not exist before 2022-05, so BLOOM and Korthikanti's
  baselines try only none and full;
- the published figure is an iteration time; memory outcomes (OOM or not) are scored as
  agreement counts.

What a planner needs most is the right order. Runs of one model on one cluster with one batch
form a job; within each job of 3 or more timed runs, ``ranking`` counts the pairs whose measured
times differ by over 3% and that the predictions put in the same order, and the regret: how much
slower the run predicted fastest was measured than the fastest measured run.

No torch here: scoring needs only the simulator.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustersim.simulator.costs.result import StepResult
from clustersim.simulator.inputs.scenario import Scenario, build_scenario
from clustersim.topologies.profile import Profile, profile_for_gpu
from clustersim.yamlio import load_yaml_file

from . import unpublished

# The id a profile's ``fitted_on`` uses for the whole file; a source's own id (its group, e.g.
# "vtrain-multi-node") names that source alone. Either moves the source out of validation.
DEVSET_TABLE = "published-dev"

# Inter-node bandwidth, GB/s per GPU per direction, where a source documents a slower network
# than its preset's DGX (8 x 200 Gb/s HDR = 25 GB/s per GPU):
# - BLOOM's Jean Zay: 4 x 100 Gb/s Omni-Path links per 8-GPU node (bigscience tr11-176B-ml
#   README, "8 GPUs per node Using NVLink 4 inter-gpu connects, 4 OmniPath links") -> 400/8/8;
# - vTrain's validation configs: inter_node_bandwidth=800 per 8-GPU node, read as Gb/s
#   (VIA-Research/vTrain config/validation/multi/*.json) -> 800/8/8.
INTER_NODE_GBPS = {"bloom": 6.25, "vtrain": 12.5}
# vTrain's Megatron-DeepSpeed configs disable gradient bucketing, so DP reduction does not overlap.
NO_GRAD_OVERLAP = ("vtrain",)
# Sources that trained without FlashAttention (all published before it was in Megatron-LM).
NO_FLASH = ("korthikanti2022", "bloom", "vtrain")
# Sources from before selective recomputation (Korthikanti et al. introduced it, 2022-05).
BEFORE_SELECTIVE = ("korthikanti2022", "bloom")
ORDER_MARGIN = 0.03  # measured times closer than this are a tie (run-to-run noise), not an order
MIN_JOB_RUNS = 3  # a job of fewer timed runs says little about ranking

Predict = Callable[[Scenario, Profile], StepResult]


@dataclass(frozen=True, slots=True)
class DevRun:
    """One published run as scenarios: its candidates (one, or one per unpublished setting)
    and what was measured (an iteration time, an OOM outcome, or both)."""

    id: str
    source: str  # the YAML's group, e.g. "vtrain-multi-node"
    candidates: tuple[dict, ...]  # raw scenario mappings (SCENARIO.md form)
    job: tuple  # runs with the same job are ranked against each other
    published_s: float | None  # iteration time
    oom: bool | None  # True: the run did not fit; None: not reported


@dataclass(frozen=True, slots=True)
class DevResult:
    """A run beside the prediction of its fastest candidate that fits (or, if none fits, its
    fastest), under the shipped profile of its GPU."""

    run: DevRun
    predicted_s: float
    fits: bool
    profile: Profile

    @property
    def error(self) -> float | None:
        """Relative error of the iteration time, predicted / published - 1."""
        if self.run.published_s is None:
            return None
        return self.predicted_s / self.run.published_s - 1

    @property
    def fitted(self) -> bool:
        """Whether the profile that predicted it was fitted on this run's source."""
        return bool({self.run.source, DEVSET_TABLE} & set(self.profile.fitted_on))


@dataclass(frozen=True, slots=True)
class SourceScore:
    """One source's iteration-time errors."""

    source: str
    runs: int
    mean_abs: float
    signed: float
    worst: float


@dataclass(frozen=True, slots=True)
class Ranking:
    """Order within jobs: pairs put in the measured order, and the regret of each job's pick."""

    right: int
    pairs: int
    regrets: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class DevScore:
    """Everything the development set says about a set of predicted runs."""

    sources: tuple[SourceScore, ...]
    memory_agree: int
    memory_total: int
    ranking: Ranking
    errors: tuple[float, ...]  # every timed run's relative error


# ---------------------------------------------------------------------------- runs as scenarios


def cluster_preset(gpu: str | None) -> str | None:
    """The cluster preset of a published GPU name; None where there is none."""
    if re.search(r"A100.*40", gpu or ""):
        return "dgx-a100-40gb"
    return "dgx-a100-80gb" if "A100" in (gpu or "") else None


def base_scenario(raw: dict) -> dict | None:
    """The scenario of a published run as published; None if it cannot be expressed."""
    group, model, par, hw = raw["group"], raw["model"], raw["parallelism"], raw["hardware"]
    cluster = cluster_preset(hw.get("gpu"))
    if cluster is None or any(model.get(k) is None for k in ("layers", "hidden", "heads",
                                                              "seq_len")):
        return None
    tp, pp = par.get("tp") or 1, par.get("pp") or 1
    scenario = {
        "name": raw["id"],
        "model": _model(model),
        "cluster": {"preset": cluster, "gpus": hw["num_gpus"]},
        "training": _training(raw, par, pp),
        "parallel": _parallel(par, tp, pp, hw["num_gpus"]),
    }
    for prefix, bandwidth in INTER_NODE_GBPS.items():
        if group.startswith(prefix):
            scenario["cluster"]["inter_node"] = {"bandwidth": bandwidth}
    if group.startswith(NO_GRAD_OVERLAP):
        scenario["parallel"]["overlap_grad_reduce"] = False
    return scenario


def _model(model: dict) -> dict:
    return {"layers": model["layers"], "hidden": model["hidden"], "heads": model["heads"],
            "seq_len": model["seq_len"], "kv_heads": model.get("kv_heads") or model["heads"],
            "ffn_hidden": model.get("ffn_hidden") or 4 * model["hidden"],
            "vocab": model.get("vocab") or 51200, "ffn_kind": "gelu"}


def _training(raw: dict, par: dict, pp: int) -> dict:
    # the micro-batch; without a pipeline a source may print it as the local batch
    micro = (par.get("micro_batch_size") or (par.get("local_batch_size") if pp == 1 else None)
             or 1)
    precision = "fp16" if "fp16" in str(raw.get("precision", "")).lower() else "bf16"
    return {"global_batch": par["global_batch_size"], "micro_batch": micro,
            "precision": precision, "flash_attention": not raw["group"].startswith(NO_FLASH)}


def _parallel(par: dict, tp: int, pp: int, gpus: int) -> dict:
    vpp = par.get("vpp") or 1
    schedule = str(par.get("schedule") or "").lower()
    interleaved = vpp > 1 and ("interleav" in schedule or not schedule)
    recompute = str(par.get("recompute") or "none").lower()
    return {"tp": tp, "pp": pp, "dp": gpus // (tp * pp),
            "schedule": "interleaved" if interleaved else "1f1b",
            "virtual_stages": vpp if interleaved else 1,
            "zero": par.get("zero_stage") or 0,
            "sequence_parallel": bool(par.get("sequence_parallel")),
            "recompute": "full" if recompute.startswith("full") else
                         "selective" if recompute.startswith("selective") else "none"}


def candidates(raw: dict, scenario: dict) -> list[dict]:
    """The scenarios a run may have been: one per recomputation where none was published
    (``unpublished.py``, the rule the published tables follow too)."""
    if raw["parallelism"].get("recompute") is not None:
        return [scenario]
    kinds = (unpublished.BEFORE_SELECTIVE if raw["group"].startswith(BEFORE_SELECTIVE)
             else unpublished.RECOMPUTE)
    return unpublished.recompute_candidates(scenario, kinds)


def measured(raw: dict) -> tuple[float | None, bool | None]:
    """(iteration time in seconds, OOM outcome) as published, each None if not."""
    figures = raw["measured"]
    seconds = None
    if figures.get("iteration_time_s") is not None:
        seconds = float(figures["iteration_time_s"])
    elif figures.get("iteration_time_ms") is not None:
        seconds = float(figures["iteration_time_ms"]) / 1000
    oom = bool(figures["oom"]) if figures.get("oom") is not None else None
    return seconds, oom


def to_run(raw: dict[str, Any]) -> DevRun | None:
    """A published run as a DevRun; None if it cannot be expressed or has nothing to compare."""
    scenario = base_scenario(raw)
    seconds, oom = measured(raw)
    if scenario is None or (seconds is None and oom is None):
        return None
    job = (raw["group"].split("-")[0], raw["model"]["layers"], raw["model"]["hidden"],
           raw["hardware"]["num_gpus"], raw["parallelism"]["global_batch_size"])
    return DevRun(raw["id"], raw["group"], tuple(candidates(raw, scenario)), job, seconds, oom)


def load_runs(path: str | Path) -> list[DevRun]:
    """Every comparable run of a development-set file, in the file's order."""
    return [run for raw in load_yaml_file(Path(path)) if (run := to_run(raw)) is not None]


# ------------------------------------------------------------------------------------ scoring


def predict_run(run: DevRun, predict: Predict) -> DevResult:
    """The run's candidates predicted; the fastest that fits is the run's prediction."""
    predicted = []
    for raw in run.candidates:
        scenario = build_scenario(raw, raw["name"])
        profile = profile_for_gpu(scenario.cluster.gpu.id)
        predicted.append((predict(scenario, profile), profile))
    fitting = [p for p in predicted if p[0].fits] or predicted
    result, profile = min(fitting, key=lambda p: p[0].step_time_s)
    return DevResult(run, result.step_time_s, result.fits, profile)


def predict_runs(runs: Iterable[DevRun], predict: Predict) -> list[DevResult]:
    return [predict_run(run, predict) for run in runs]


def score(results: Iterable[DevResult]) -> DevScore:
    """Per-source errors, memory agreement and ranking of some predicted runs."""
    results = list(results)
    timed = [r for r in results if r.error is not None]
    with_oom = [r for r in results if r.run.oom is not None]
    agree = sum(r.fits == (not r.run.oom) for r in with_oom)
    return DevScore(source_scores(timed), agree, len(with_oom), ranking(timed),
                    tuple(r.error for r in timed))


def source_scores(timed: list[DevResult]) -> tuple[SourceScore, ...]:
    """Mean absolute, signed mean and worst error of each source, sorted by source."""
    by_source: dict[str, list[float]] = {}
    for r in timed:
        by_source.setdefault(r.run.source, []).append(r.error)
    return tuple(SourceScore(source, len(errors), statistics.fmean(map(abs, errors)),
                             statistics.fmean(errors), max(map(abs, errors)))
                 for source, errors in sorted(by_source.items()))


def ranking(timed: list[DevResult]) -> Ranking:
    """Pairs in the measured order and each job's regret, over jobs of MIN_JOB_RUNS or more."""
    jobs: dict[tuple, list[tuple[float, float]]] = {}
    for r in timed:
        jobs.setdefault(r.run.job, []).append((r.run.published_s, r.predicted_s))
    right = pairs = 0
    regrets = []
    for runs in jobs.values():
        if len(runs) < MIN_JOB_RUNS:
            continue
        for (measured_a, predicted_a), (measured_b, predicted_b) in itertools.combinations(runs, 2):
            if abs(measured_a / measured_b - 1) > ORDER_MARGIN:
                pairs += 1
                right += (measured_a < measured_b) == (predicted_a < predicted_b)
        picked = min(runs, key=lambda run: run[1])[0]
        regrets.append(picked / min(run[0] for run in runs) - 1)
    return Ranking(right, pairs, tuple(regrets))
