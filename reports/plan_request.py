"""A plan request from plain values (the CLI's flags or the Python API's arguments), its checks,
and the search's outcome as one object (``PlanSearch``) whose ``to_list()`` is ``plan --json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from clustersim.errors import ScenarioError, from_validation_error, unknown_key
from clustersim.fields import (
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Probability,
    Tokens,
)
from clustersim.simulator.inputs.hf_config import anchor
from clustersim.simulator.inputs.scenario import (
    CLUSTER_KEYS,
    apply_values,
    build_cluster,
    build_scenario,
)
from clustersim.simulator.inputs.specs import SECTION_KEYS, ParallelSpec, TrainingSpec
from clustersim.yamlio import load_yaml_file

from .launch import launch
from .plan import Plan, PlanRequest, plan, plan_fastest_pool_alone
from .pool_plan import FastestPoolAlone, is_pooled, one_gpu_cluster
from .processes import Workers
from .records import RecordNote, record_note

TOKENS_PER_STEP = 4 * 2**20  # default global batch: about 4M tokens, as Llama-scale runs use
# Set by --gpus and --global-batch themselves; a --fix of them would contradict the flags.
FLAG_FIELDS = {"cluster.gpus": "--gpus", "cluster.nodes": "--gpus",
               "training.global_batch": "--global-batch"}


@dataclass(frozen=True)
class PlanSearch:
    """The fastest plans that fit (fastest first), and how many splits were valid and fit."""

    request: PlanRequest
    plans: list[Plan]
    valid: int
    fitting: int
    fastest_pool_alone: FastestPoolAlone | None = None  # a cluster of pools: the comparison
    record: RecordNote | None = None  # the published record the plans beat, if any

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def to_list(self) -> list[dict]:
        """What ``clustersim plan --json`` prints: one object per plan (on a cluster of pools,
        each with ``plan.fastest_pool_alone``)."""
        out = [p.as_dict(self.request.gpu_hour_price) for p in self.plans]
        if self.fastest_pool_alone is not None:
            for entry in out:
                entry["plan"]["fastest_pool_alone"] = self.fastest_pool_alone.as_dict()
        if self.record is not None:
            for i in self.record.above:
                out[i]["plan"]["above_record"] = self.record.record.as_dict()
            if self.record.walk:
                out[0]["plan"]["above_record"]["credits"] = [c.as_dict()
                                                             for c in self.record.walk]
        return out


def search(req: PlanRequest, top: int = 5, progress: Any = None,
           jobs: int | Workers = 1) -> PlanSearch:
    """The plans; on a cluster of pools, also the best plan of its fastest pool alone.
    ``jobs``: processes (or ``Workers``) to search with (the answer does not depend on it)."""
    plans, valid, fitting = plan(req, top, progress, jobs=jobs)
    alone = plan_fastest_pool_alone(req, top) if is_pooled(req) else None
    note = None if is_pooled(req) or req.profile is not None else record_note(
        [p.scenario for p in plans], [p.result.mfu for p in plans])
    return PlanSearch(req, plans, valid, fitting, alone, note)


def section(value: str | dict, key: str) -> dict:
    """A preset name, a mapping, or the ``key`` section of a YAML file (or the file itself);
    a relative ``hf_config`` in a file is relative to that file, as in a scenario."""
    if isinstance(value, dict):
        return dict(value)
    path = Path(value)
    if not path.exists():
        return {"preset": value}
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"--{key}", f"{value!r} is not a YAML mapping")
    found = data.get(key, data)
    if not isinstance(found, dict):
        raise ScenarioError(f"--{key}", f"{value!r} has no {key} mapping")
    return anchor({key: found}, path)[key]


def make_request(model: str | dict, cluster: str | dict, gpus: int | None, *,
                 fixed: dict[str, Any] | None = None, tokens: float | None = None,
                 global_batch: int | None = None, seq_len: int | None = None,
                 memory_reserve: float = 0.05, mtbf_hours: float | None = None,
                 checkpoint_write_s: float = 60.0, checkpoint_restore_s: float = 300.0,
                 gpu_hour_price: float | None = None) -> PlanRequest:
    """A checked PlanRequest; every mistake is a ScenarioError naming the flag or field."""
    _check_numbers(gpus, tokens, global_batch, seq_len, memory_reserve, mtbf_hours,
                   checkpoint_write_s, checkpoint_restore_s, gpu_hour_price)
    model_raw = section(model, "model")
    if seq_len:
        model_raw = {**model_raw, "seq_len": seq_len}
    pinned, sections = split_fixes(fixed or {})
    model_raw = apply_values(model_raw, sections["model"])
    cluster_raw = _sized(apply_values(section(cluster, "cluster"), sections["cluster"]), gpus)
    batch = global_batch or _default_batch(model_raw, cluster_raw)
    return PlanRequest(model_raw, cluster_raw, batch, tokens=tokens, mtbf_hours=mtbf_hours,
                       checkpoint_write_s=checkpoint_write_s,
                       checkpoint_restore_s=checkpoint_restore_s, gpu_hour_price=gpu_hour_price,
                       memory_reserve=memory_reserve, training=sections["training"],
                       fixed=pinned)


def _sized(cluster: dict, gpus: int | None) -> dict:
    """The cluster section with ``gpus`` set: ``--gpus``, or a cluster of pools' own sum."""
    if "pools" not in cluster:
        if gpus is None:
            raise ScenarioError("--gpus", "give the GPUs to plan for (only a cluster made of "
                                          "pools knows its own)")
        return {**{k: v for k, v in cluster.items() if k != "nodes"}, "gpus": gpus}
    held = build_cluster(cluster).gpus
    if gpus is not None and gpus != held:
        raise ScenarioError("--gpus", f"the cluster's pools hold {held} GPUs; give --gpus "
                                      f"{held} or leave it out")
    return {**cluster, "gpus": held}


def split_fixes(fixed: dict[str, Any]) -> tuple[dict, dict[str, dict]]:
    """Pinned fields as (search pins: parallel.* and training.micro_batch, validated; and
    the model/cluster/training fields to lay over the request's sections)."""
    pinned: dict[str, Any] = {}
    sections: dict[str, dict] = {"model": {}, "cluster": {}, "training": {}}
    for path, value in fixed.items():
        head, _, rest = path.partition(".")
        if path in FLAG_FIELDS:
            raise ScenarioError(path, f"set by {FLAG_FIELDS[path]}, not --fix")
        allowed = {**SECTION_KEYS, "cluster": CLUSTER_KEYS}.get(head)
        if allowed is None:
            raise ScenarioError(path, unknown_key(head, ("model", "cluster", "training",
                                                         "parallel")))
        if not rest or rest.split(".")[0] not in allowed:
            raise ScenarioError(path, unknown_key(rest.split(".")[0], allowed))
        if head == "parallel" or path == "training.micro_batch":
            pinned[path] = _validated(path, value)
        else:
            sections[head][rest] = value
    return pinned, sections


def _validated(path: str, value: Any) -> Any:
    """The pinned value checked against its field's type alone (cross-field rules are checked
    on every candidate): ``tp=eight`` fails here, ``8`` stays 8."""
    head, key = path.split(".", 1)
    spec = ParallelSpec if head == "parallel" else TrainingSpec
    info = spec.model_fields.get(key)
    if info is None:
        raise ScenarioError(path, unknown_key(key, list(spec.model_fields)))
    try:
        kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=path) from None


# The flags' types: the scenario fields' own (clustersim/fields.py), so a flag takes what the
# field it feeds takes, finite and within physical reach.
FLAG_TYPES = {"--gpus": PositiveInt, "--tokens": Tokens, "--global-batch": PositiveInt,
              "--seq-len": PositiveInt, "--memory-reserve": Probability,
              "--mtbf-hours": PositiveFloat, "--checkpoint-write-s": NonNegativeFloat,
              "--checkpoint-restore-s": NonNegativeFloat, "--gpu-hour-price": PositiveFloat}


def _check_numbers(gpus: int | None, tokens: float | None, global_batch: int | None,
                   seq_len: int | None, memory_reserve: float, mtbf_hours: float | None,
                   write_s: float, restore_s: float, price: float | None) -> None:
    values = (gpus, tokens, global_batch, seq_len, memory_reserve, mtbf_hours, write_s,
              restore_s, price)
    for (flag, kind), value in zip(FLAG_TYPES.items(), values, strict=True):
        if value is None:
            continue
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            raise from_validation_error(exc, prefix=flag) from None
    if tokens is not None and tokens <= 0:
        raise ScenarioError("--tokens", f"must be positive (got {tokens})")


def _default_batch(model: dict, cluster: dict) -> int:
    seq = build_scenario({"model": model, "cluster": one_gpu_cluster(cluster),
                          "training": {"global_batch": 1}}).model.seq_len
    return 2 ** max(0, round(math.log2(TOKENS_PER_STEP / seq)))


def save_best(found: PlanSearch, path: str | Path) -> None:
    """Write the best plan as a scenario file (``clustersim simulate FILE`` reproduces it),
    with the arguments of its training stack as a comment (``launch.py``); the file appears
    whole or not at all."""
    best = found.best
    if best is None:
        raise ScenarioError("--save-best", "no split fits; nothing written")
    header = (f"# The fastest split clustersim plan found: {best.result.step_time_s:.3f} s per "
              f"step, peak {best.result.peak_bytes / 2**30:.2f} GiB per GPU.\n"
              + "".join(f"# {line}\n" for line in launch(best.scenario).lines("this split")))
    text = header + yaml.safe_dump(best.scenario.as_dict(), sort_keys=False)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
