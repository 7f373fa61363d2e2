"""The capacity planner: the fastest splits of a model over N GPUs that fit in memory.

Search: every valid combination of tp, cp, pp, ep, micro-batch, schedule (1F1B, ZB-H1, interleaved
with 2-8 chunks), ZeRO stage and recomputation, with sequence parallelism on whenever tp > 1
(it saves memory at no extra communication). GPipe is left out: it has 1F1B's bubble and holds
more activations, so it never wins. Each candidate is validated like a scenario file; the
analytic estimate prunes to those that fit, the engine ranks the fastest of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from clustersim.errors import ScenarioError
from clustersim.simulator.analytic import estimate
from clustersim.simulator.engine import simulate
from clustersim.simulator.result import StepResult
from clustersim.simulator.scenario import Scenario, apply_values, build_cluster, build_scenario
from clustersim.simulator.schedules import SCHEDULES, PipelineSchedule
from clustersim.simulator.spread import Spread, spread
from clustersim.simulator.stage_costs import uncertain_profile
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.pools import PooledCluster

from .megatron import megatron_args
from .pool_plan import balanced, one_gpu_cluster, pipeline_depths, pool_variants
from .resilience import CheckpointPlan, checkpoint_plan

MICRO_BATCHES = (1, 2, 4)
VIRTUAL_STAGES = (2, 4, 8)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
LONG_SEQUENCE = 16384  # context parallelism is searched from this sequence length on
ENGINE_SHORTLIST = 4  # the engine ranks this many times --top of the analytic best


@dataclass(frozen=True)
class PlanRequest:
    model: dict  # the scenario's model section (a preset name or full shape)
    cluster: dict  # its cluster section, with ``gpus``
    global_batch: int
    tokens: float | None = None
    mtbf_hours: float | None = None  # per GPU
    checkpoint_write_s: float = 60.0
    checkpoint_restore_s: float = 300.0
    gpu_hour_price: float | None = None
    training: dict = field(default_factory=dict)  # other training fields (precision, ...)
    memory_reserve: float = 0.05  # fraction of GPU memory kept free (allocator, CUDA context)
    # Pinned fields (``--fix``): parallel.* and training.micro_batch, dotted path -> value;
    # a pinned value outside the search space is still used.
    fixed: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    result: StepResult
    checkpoint: CheckpointPlan | None
    spread: Spread | None = None  # plan --samples: the step's error bars

    @property
    def headroom_bytes(self) -> float:
        return self.result.headroom_bytes

    @property
    def gpu_hours(self) -> float | None:
        t = self.result.time_to_train_s
        return None if t is None else t * self.result.gpus / 3600

    def as_dict(self, price: float | None = None) -> dict:
        hours = self.gpu_hours
        extra = {"gpu_hours": hours, "memory_headroom_bytes": int(self.headroom_bytes)}
        if price is not None and hours is not None:
            extra["cost"] = hours * price
        if self.checkpoint is not None:
            extra["checkpoint"] = self.checkpoint.as_dict()
        extra["megatron_args"] = megatron_args(self.scenario)
        if self.spread is not None:
            extra.update(self.spread.as_json())
        return {"scenario": self.scenario.as_dict(), "result": self.result.to_json(),
                "plan": extra}


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def candidates(req: PlanRequest, base: Scenario,
               cluster: ClusterSpec | PooledCluster | None = None) -> Iterator[dict]:
    """Raw scenarios of every split worth trying (validity is checked by the caller); a field
    pinned in ``req.fixed`` takes only its pinned value. On a cluster of pools, tp fits a node
    of every pool and the pipeline depths are those whose stages are whole in each pool."""
    m, c = base.model, cluster or base.cluster
    gpus = req.cluster["gpus"]

    def pick(path: str, values: list) -> list:
        return [req.fixed[path]] if path in req.fixed else values

    tps = pick("parallel.tp", [t for t in _powers_of_two(min(c.gpus_per_node, m.heads))
                               if m.heads % t == 0])
    cps = pick("parallel.cp", [1] + ([2, 4, 8] if m.seq_len >= LONG_SEQUENCE else []))
    pps = pick("parallel.pp", pipeline_depths(m.layers, gpus, c) if isinstance(c, PooledCluster)
               else [p for p in _powers_of_two(min(m.layers, gpus)) if p <= m.layers])
    eps = pick("parallel.ep", [e for e in _powers_of_two(m.experts) if m.experts % e == 0]
               if m.experts > 1 else [1])
    for tp, cp, pp, ep, mb in itertools.product(
            tps, cps, pps, eps, pick("training.micro_batch", list(MICRO_BATCHES))):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        if (dp * cp) % ep or req.global_batch % (dp * mb) or dp != req.fixed.get("parallel.dp",
                                                                                 dp):
            continue
        for variant in _variants(req, base, tp, pp, dp * cp):
            yield {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, **variant,
                   "micro_batch": mb}


def _chunk_counts(sched: PipelineSchedule) -> tuple[int, ...]:
    """The chunks per rank the planner tries with a schedule."""
    return sched.chunk_counts or (VIRTUAL_STAGES if sched.chunks_per_rank else (1,))


def _variants(req: PlanRequest, base: Scenario, tp: int, pp: int, replicas: int
              ) -> Iterator[dict]:
    """Schedule, ZeRO stage, recomputation and the tensor-parallel switches of one shape."""
    fixed = req.fixed
    layers = base.model.layers
    if "parallel.schedule" in fixed:
        vs = [fixed.get("parallel.virtual_stages", v)
              for v in _chunk_counts(SCHEDULES[fixed["parallel.schedule"]])]
        schedules = [(fixed["parallel.schedule"], v) for v in dict.fromkeys(vs)]
    elif "parallel.virtual_stages" in fixed:
        v = fixed["parallel.virtual_stages"]
        schedules = [("interleaved", v)] if v > 1 else [("1f1b", 1)]
    elif pp == 1:  # one stage: every schedule runs the same work
        schedules = [("1f1b", 1)]
    else:  # the registered schedules the planner tries, each chunk count that fits the layers
        schedules = [(name, v) for name, sched in SCHEDULES.items() if sched.searched
                     for v in _chunk_counts(sched) if pp * v <= layers]
    # Under a pipeline ZeRO-2 runs as ZeRO-1 (ParallelSpec.sharded_gradients): one candidate.
    zeros = [fixed["parallel.zero"]] if "parallel.zero" in fixed else (
        [z for z in ZERO_STAGES if not (z == 2 and pp > 1)] if replicas > 1 else (0,))
    # With fused attention, selective recomputation has nothing left to drop: it is "none".
    recomputes = [fixed["parallel.recompute"]] if "parallel.recompute" in fixed else [
        r for r in RECOMPUTE if not (r == "selective" and base.training.flash_attention)]
    sp = fixed.get("parallel.sequence_parallel", tp > 1)
    # Overlapping TP collectives with GEMMs needs sequence parallelism (Megatron-Core).
    overlaps = [fixed["parallel.tp_comm_overlap"]] if "parallel.tp_comm_overlap" in fixed else (
        [False, True] if tp > 1 and sp else [False])
    for (schedule, v), zero, recompute, overlap in itertools.product(
            schedules, zeros, recomputes, overlaps):
        yield {"schedule": schedule, "virtual_stages": v, "zero": zero, "recompute": recompute,
               "sequence_parallel": sp, "tp_comm_overlap": overlap}


def plan(req: PlanRequest, top: int = 5,
         progress: Callable[[int, int], None] | None = None) -> tuple[list[Plan], int, int]:
    """The ``top`` fastest splits that fit; also how many were valid and how many fit."""
    cluster = build_cluster(req.cluster)  # the GPU count itself must make whole nodes
    # The shapes of model and cluster, validated once (one GPU: any batch splits over it).
    base = build_scenario({"model": req.model, "cluster": one_gpu_cluster(req.cluster),
                           "training": {"global_batch": 1, **req.training}}, "plan")
    tried = list(candidates(req, base, cluster))
    if not tried and req.fixed:
        pins = ", ".join(f"{k}={v}" for k, v in req.fixed.items())
        raise ScenarioError("--fix", f"no split of {req.cluster['gpus']} GPUs with {pins} "
                                     f"divides the GPUs and the global batch {req.global_batch}")
    if not tried:
        raise ScenarioError("--gpus", f"no split of {req.cluster['gpus']} GPUs divides the global "
                                      f"batch {req.global_batch} evenly")
    fitting: list[tuple[float, Scenario]] = []
    valid, first_error = 0, None
    for i, split in enumerate(tried):
        if progress:
            progress(i + 1, len(tried))
        for s in _scenarios(req, split, cluster):
            if isinstance(s, ScenarioError):
                first_error = first_error or s
                continue  # e.g. kv heads against tp, or interleaving a too-short pipeline
            valid += 1
            estimated = estimate(s)
            if _fits(estimated, req.memory_reserve):
                fitting.append((estimated.step_time_s, s))
    if valid == 0 and req.fixed and first_error is not None:
        raise first_error  # the pinned fields rule out every split: say why
    fitting.sort(key=lambda pair: pair[0])
    ranked = []
    for _, s in fitting[: max(ENGINE_SHORTLIST * top, 10)]:
        result = simulate(s)
        if _fits(result, req.memory_reserve):
            ranked.append((_rank_key(result), s, result))
    ranked.sort(key=lambda item: item[0])
    plans = [Plan(s, r, _checkpoint(req, r)) for _, s, r in ranked[:top]]
    return plans, valid, len(fitting)


def _scenarios(req: PlanRequest, split: dict, cluster: ClusterSpec | PooledCluster
               ) -> Iterator[Scenario | ScenarioError]:
    """The scenarios of one split, or the errors that rule them out: on a cluster of pools,
    one per placement of the stages on the pools, with layers spread evenly and balanced
    over the stages' speeds (``pool_plan.py``)."""
    raw = _raw(req, split)
    if not isinstance(cluster, PooledCluster):
        yield _built(raw, _name(split))
        return
    for placed in pool_variants(raw, split, cluster, req.fixed):
        s = _built(placed, _name(split, placed["parallel"].get("stage_pools")))
        yield s
        evened = None if isinstance(s, ScenarioError) else balanced(placed, s, req.fixed)
        if evened is not None:
            yield _built(evened, f"{s.name}-balanced")


def _built(raw: dict, name: str) -> Scenario | ScenarioError:
    try:
        return build_scenario(raw, name)
    except ScenarioError as exc:
        return exc


def _rank_key(r: StepResult) -> tuple[float, float]:
    """Fastest first; equal step times (to the nanosecond) go to the one with more free memory."""
    return round(r.step_time_s, 9), r.peak_bytes


def _fits(r: StepResult, reserve: float) -> bool:
    return r.fits_within(reserve)


def _raw(req: PlanRequest, split: dict) -> dict:
    split = dict(split)
    training = {"global_batch": req.global_batch, "micro_batch": split.pop("micro_batch", 1),
                **req.training}
    if req.tokens is not None:
        training["tokens"] = req.tokens
    raw = {"model": req.model, "cluster": req.cluster, "training": training, "parallel": split}
    # Pinned fields the search does not vary (overlap_grad_reduce, order ...) are set as given.
    return apply_values(raw, req.fixed)


def _name(split: dict, stage_pools: list[int] | None = None) -> str:
    v = f"x{split['virtual_stages']}" if split["virtual_stages"] > 1 else ""
    pools = f"-pools{''.join(map(str, stage_pools))}" if stage_pools else ""
    return (f"tp{split['tp']}-pp{split['pp']}-dp{split['dp']}-cp{split['cp']}-ep{split['ep']}"
            f"-mb{split['micro_batch']}-{split['schedule']}{v}-z{split['zero']}-"
            f"{split['recompute']}{'-tpoverlap' if split.get('tp_comm_overlap') else ''}{pools}")


def _checkpoint(req: PlanRequest, r: StepResult) -> CheckpointPlan | None:
    if req.mtbf_hours is None or r.time_to_train_s is None:
        return None
    return checkpoint_plan(r.time_to_train_s, r.gpus, req.mtbf_hours, req.checkpoint_write_s,
                           req.checkpoint_restore_s)


def with_error_bars(plans: list[Plan], samples: int, seed: int = 0) -> list[Plan]:
    """The plans, each with its step's median and 90% interval over ``samples`` draws of its
    GPU's profile uncertainty (the engine, as the ranking ran)."""
    def bars(s: Scenario) -> Spread:
        return spread(lambda drawn: simulate(s, profile=drawn),
                      uncertain_profile(s, None, "--samples"), samples, seed)
    return [replace(p, spread=bars(p.scenario)) for p in plans]
