"""The planner's candidates as scenarios: each split's raw mapping (``_raw``), built as a
scenario file is (``ScenarioBuilder``), one scenario per placement on a cluster of pools.

Why a builder of its own: a plan tries tens of thousands of splits (84K for Mixtral 8x7B on
256 GPUs) whose model, cluster and training sections are the same but for the micro-batch,
and validating those sections again for each was a quarter of the search. ``ScenarioBuilder``
validates each distinct section once (the same functions ``build_scenario`` calls, so the
same specs and the same errors) and builds every candidate's scenario from the validated
sections with ``assemble_scenario``, ``build_scenario``'s own second half: the defaults of
the framework and the rules that span sections run for every candidate as before.
``tests/reports/test_plan_build.py`` compares it with ``build_scenario`` on every candidate
of two problems, errors included.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from clustersim.errors import ScenarioError
from clustersim.simulator.costs.last_scenario import Same
from clustersim.simulator.inputs import frameworks
from clustersim.simulator.inputs.scenario import (
    Scenario,
    apply_values,
    assemble_scenario,
    build_cluster,
    build_model,
    build_parallel,
    build_training,
    scenario_name,
)
from clustersim.simulator.inputs.specs import ParallelSpec, TrainingSpec
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.pools import PooledCluster

from .pool_plan import balanced, pool_variants

if TYPE_CHECKING:
    from .plan import PlanRequest

_UNSET = object()


class _Validated:
    """One section validated by ``build``, kept while the next raw section equals the last
    (the planner's model and cluster sections never change within a request)."""

    def __init__(self, build: Callable[[Any], Any]) -> None:
        self.build = build
        self.raw: Any = _UNSET
        self.value: Any = None
        self.error: ScenarioError | None = None

    def of(self, raw: Any) -> Any:
        """The validated section of ``raw``; raises its ScenarioError as ``build`` does."""
        if self.raw is _UNSET or raw != self.raw:
            self.value, self.error = None, None
            try:
                self.value = self.build(raw)
            except ScenarioError as exc:
                self.error = exc
            self.raw = copy.deepcopy(raw)
        if self.error is not None:
            raise self.error
        return self.value


class ScenarioBuilder:
    """``build_scenario(raw, name)`` for the candidates of one request, validating the model
    and cluster sections once, each distinct training section (one per micro-batch) once and
    each distinct parallel section (one per split) once; the framework's defaults and the
    cross-section rules per candidate."""

    def __init__(self) -> None:
        self.model = _Validated(build_model)
        self.cluster = _Validated(build_cluster)
        self.training: dict[Any, _Validated] = {}
        self.parallel: dict[Any, _Validated] = {}
        # The framework's defaults of each validated section, by the sections' identity (the
        # tables above keep them alive) and what each half reads of the other section.
        self.resolved: dict[tuple, Any] = {}

    def build(self, raw: dict, name: str) -> Scenario | ScenarioError:
        """The scenario of ``raw`` (named ``name`` unless it names itself), or the error that
        rules it out: the first ``build_scenario`` would raise, in the order it checks."""
        try:
            name = scenario_name(raw, name)
            model = self.model.of(raw["model"])
            cluster = self.cluster.of(raw["cluster"])
            training = self._training(raw["training"])
            return assemble_scenario(name, model, cluster, training,
                                     self._parallel(raw.get("parallel")), self._resolve)
        except ScenarioError as exc:
            return exc

    def _resolve(self, training: TrainingSpec, parallel: ParallelSpec
                 ) -> tuple[TrainingSpec, ParallelSpec]:
        """``frameworks.resolve``, each half once per validated section and what it reads of
        the other (``frameworks.training_reads``, ``parallel_reads``): a split's parallel
        section once for all its micro-batches, a training section once for the splits alike
        in their ZeRO stage and pipeline. The parallel half first: it raises where the stack
        cannot run the pair, as ``resolve`` does, and is not kept then."""
        p_key = ("parallel", Same(parallel), *frameworks.parallel_reads(training))
        if p_key not in self.resolved:
            self.resolved[p_key] = frameworks.resolve_parallel(training, parallel)
        t_key = ("training", Same(training), *frameworks.training_reads(parallel))
        if t_key not in self.resolved:
            self.resolved[t_key] = frameworks.resolve_training(training, parallel)
        return self.resolved[t_key], self.resolved[p_key]

    def _parallel(self, raw: Any) -> Any:
        """The validated parallel section: a split's micro-batches share it (16K distinct
        sections among Mixtral's 84K candidates)."""
        return _validated_once(self.parallel, raw, build_parallel)

    def _training(self, raw: Any) -> Any:
        """The validated training section."""
        return _validated_once(self.training, raw, build_training)


def _validated_once(table: dict, raw: Any, build: Any) -> Any:
    """``build(raw)``, cached in ``table`` by the section's (hashable) items. The key holds each
    value's type too: ``1`` and ``True`` are equal, not the same field."""
    try:
        key = tuple((k, type(v), v) for k, v in raw.items()) if isinstance(raw, dict) else None
        hash(key)
    except TypeError:
        key = None
    if key is None:
        return build(raw)
    return table.setdefault(key, _Validated(build)).of(raw)


def scenarios_of(req: PlanRequest, split: dict, cluster: ClusterSpec | PooledCluster,
                 builder: ScenarioBuilder) -> Iterator[Scenario | ScenarioError]:
    """The scenarios of one split, or the errors that rule them out: on a cluster of pools,
    one per placement of the stages on the pools, with layers spread evenly and balanced
    over the stages' speeds (``pool_plan.py``)."""
    raw = _raw(req, split)
    if not isinstance(cluster, PooledCluster):
        yield builder.build(raw, _name(split))
        return
    for placed in pool_variants(raw, split, cluster, req.fixed):
        s = builder.build(placed, _name(split, placed["parallel"].get("stage_pools")))
        yield s
        evened = None if isinstance(s, ScenarioError) else balanced(placed, s, req.fixed)
        if evened is not None:
            yield builder.build(evened, f"{s.name}-balanced")


def _raw(req: PlanRequest, split: dict) -> dict:
    """The scenario mapping of one split: the request's model and cluster sections (shared,
    never changed: building a scenario copies what it resolves), its training section with
    the split's micro-batch, the split as the parallel section, pinned fields laid over."""
    split = dict(split)
    training = {"global_batch": req.global_batch, "micro_batch": split.pop("micro_batch", 1),
                **req.training}
    if req.tokens is not None:
        training["tokens"] = req.tokens
    varied = {"training": training, "parallel": split}
    if not req.fixed:  # both sections are new dicts of the split's values: nothing to copy
        return {"model": req.model, "cluster": req.cluster, **varied}
    if all(path.split(".")[0] in varied for path in req.fixed):
        # Pinned fields the search does not vary (overlap_grad_reduce, order ...) set as given.
        return {"model": req.model, "cluster": req.cluster, **apply_values(varied, req.fixed)}
    raw = {"model": req.model, "cluster": req.cluster, **varied}
    return apply_values(raw, req.fixed)


def _name(split: dict, stage_pools: list[int] | None = None) -> str:
    v = f"x{split['virtual_stages']}" if split["virtual_stages"] > 1 else ""
    pools = f"-pools{''.join(map(str, stage_pools))}" if stage_pools else ""
    shard = f"-shard{split['dp_shard']}" if split.get("dp_shard") else ""
    cp = f"-{split['cp_comm']}" if split.get("cp_comm") else ""
    etp = f"-etp{split['expert_tp']}" if split.get("expert_tp") else ""
    return (f"tp{split['tp']}-pp{split['pp']}-dp{split['dp']}-cp{split['cp']}{cp}"
            f"-ep{split['ep']}{etp}"
            f"-mb{split['micro_batch']}-{split['schedule']}{v}-z{split['zero']}{shard}-"
            f"{split['recompute']}{'-tpoverlap' if split.get('tp_comm_overlap') else ''}{pools}")
