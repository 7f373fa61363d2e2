"""A scenario: the validated model, cluster, training and parallel specs of one simulation.

``load_scenario`` reads SCENARIO.md's YAML, applies ``--set`` overrides to the raw mapping,
resolves presets and validates each section, fills the fields left out with the training
framework's defaults (``frameworks.py``), then checks the rules that span sections
(``tp`` divides ``heads``, ``tp*pp*dp*cp == gpus`` ...). Every failure is a ScenarioError
naming the field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from clustersim.errors import ScenarioError, from_validation_error, unknown_key
from clustersim.fields import LIMIT_REASONS, MAX_COUNT
from clustersim.topologies.hardware import ClusterSpec, GpuSpec, cluster_presets, gpu_presets
from clustersim.topologies.pools import PooledCluster
from clustersim.yamlio import load_yaml_file, parse_scalar

from . import frameworks, hf_config, pool_rules, rules
from .presets import PRESET_METADATA, model_presets, resolve_preset
from .specs import SECTION_KEYS, ModelSpec, ParallelSpec, TrainingSpec

TOP_KEYS = ("name", "model", "cluster", "training", "parallel")
CLUSTER_KEYS = ["preset", "gpus", "nodes", "pools", *ClusterSpec.model_fields]
POOL_KEYS = ["preset", "gpus", "nodes", *ClusterSpec.model_fields]


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one simulation needs; ``parallel.dp`` is always set."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec | PooledCluster
    training: TrainingSpec
    parallel: ParallelSpec

    @property
    def microbatches(self) -> int:
        """Micro-batches each pipeline runs per optimizer step: ``B / (dp * b)``."""
        return self.training.global_batch // (self.parallel.dp * self.training.micro_batch)

    def as_dict(self) -> dict[str, Any]:
        """The resolved scenario as SCENARIO.md's mapping; loading it gives this scenario back."""
        return {
            "name": self.name,
            "model": self.model.model_dump(),
            "cluster": _cluster_dict(self.cluster),
            "training": self.training.model_dump(),
            "parallel": self.parallel.model_dump(),
        }


def _cluster_dict(cluster: ClusterSpec | PooledCluster) -> dict[str, Any]:
    """A cluster as the scenario mapping gives it: a pooled one as its pools."""
    if isinstance(cluster, PooledCluster):
        return {"name": cluster.name, "pools": [_cluster_dict(pool) for pool in cluster.pools]}
    data = cluster.model_dump(exclude_none=True)
    data["preset"] = data.pop("name")
    return data


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read a scenario file, apply ``--set`` overrides (``"parallel.tp=4"``), validate."""
    return build_scenario(*raw_scenario(path, overrides))


def raw_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()
                 ) -> tuple[dict, str]:
    """A scenario file's mapping with ``--set`` overrides applied (not yet validated), and the
    name it defaults to (the file's stem)."""
    raw = load_yaml_file(path)
    if not isinstance(raw, dict):
        raise ScenarioError(str(path), "a scenario file must be a YAML mapping")
    return hf_config.anchor(apply_overrides(raw, overrides), path), Path(path).stem


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """A copy of ``raw`` with each ``dotted.path=value`` set; values are parsed as YAML scalars."""
    return apply_values(raw, parse_overrides(overrides))


def parse_overrides(overrides: list[str] | tuple[str, ...], flag: str = "--set"
                    ) -> dict[str, Any]:
    """``["parallel.tp=4"]`` as ``{"parallel.tp": 4}``; values are parsed as YAML scalars."""
    values = {}
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            raise ScenarioError(flag, f"expected dotted.path=value, got {item!r}")
        values[path.strip()] = parse_scalar(text, flag)
    return values


def apply_values(raw: dict, values: dict[str, Any]) -> dict:
    """A copy of ``raw`` with each ``{"dotted.path": value}`` set (values already parsed)."""
    result = copy.deepcopy(raw)
    for path, value in values.items():
        keys = path.split(".")
        node = result
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ScenarioError(".".join(keys[: depth + 1]), "is not a section")
            node = child
        node[keys[-1]] = value
    return result


def build_scenario(raw: dict, default_name: str = "scenario") -> Scenario:
    """Validate a raw scenario mapping (presets unresolved) into a Scenario."""
    name = scenario_name(raw, default_name)
    model = build_model(raw["model"])
    cluster = build_cluster(raw["cluster"])
    training = build_training(raw["training"])
    return assemble_scenario(name, model, cluster, training, build_parallel(raw.get("parallel")))


def scenario_name(raw: dict, default_name: str = "scenario") -> str:
    """The name of a raw scenario mapping, once its top-level keys and sections are checked."""
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise ScenarioError(str(unknown[0]), unknown_key(str(unknown[0]), TOP_KEYS))
    for section in ("model", "cluster", "training"):
        if raw.get(section) is None:
            raise ScenarioError(section, "missing section")
    name = raw.get("name", default_name)
    if not isinstance(name, str):
        raise ScenarioError("name", f"expected text, got {name!r}")
    return name


def build_model(section: Any) -> ModelSpec:
    """The model section (a preset, a Hugging Face config or fields) validated."""
    return _validate(ModelSpec, _model_raw(section), "model")


def build_training(section: Any) -> TrainingSpec:
    """The training section validated, the framework's defaults not yet filled in."""
    return _validate(TrainingSpec, section, "training")


def build_parallel(section: Any) -> ParallelSpec:
    """The parallel section (None: every field left out) validated, defaults not yet filled."""
    return _validate(ParallelSpec, section or {}, "parallel")


def assemble_scenario(name: str, model: ModelSpec, cluster: ClusterSpec | PooledCluster,
                      training: TrainingSpec, parallel: ParallelSpec,
                      resolve: Callable[[TrainingSpec, ParallelSpec],
                                        tuple[TrainingSpec, ParallelSpec]] | None = None
                      ) -> Scenario:
    """The scenario of validated sections: the framework's defaults filled in (``resolve``,
    by default ``frameworks.resolve``), then the rules that span sections checked
    (``build_scenario``'s last half; the planner, which validates the sections its
    candidates share once, calls it for each, with a ``resolve`` that keeps its answers)."""
    training, parallel = (resolve or frameworks.resolve)(training, parallel)
    rules.check_split(Scenario(name, model, cluster, training, parallel))
    parallel = rules.with_data_parallel(parallel, cluster.gpus)
    parallel = pool_rules.with_stage_pools(Scenario(name, model, cluster, training, parallel))
    scenario = Scenario(name, model, cluster, training, parallel)
    rules.check_replicas(scenario)
    return scenario


def _model_raw(section: Any) -> Any:
    """The model section with its preset or Hugging Face config (``hf_config``) resolved."""
    if isinstance(section, dict) and hf_config.HF_KEY in section:
        return hf_config.import_model(section)
    model_raw = resolve_preset(section, model_presets(), "model", drop=PRESET_METADATA)
    if isinstance(section, dict) and "preset" in section:
        model_raw.setdefault("name", section["preset"])
    return model_raw


def build_cluster(section: Any, field: str = "cluster") -> ClusterSpec | PooledCluster:
    """Resolve ``cluster`` (preset, ``gpus`` or ``nodes``, tier overrides) into a ClusterSpec,
    or a ``pools`` list of such sections into a PooledCluster."""
    if isinstance(section, dict) and "pools" in section:
        return _build_pools(section, field)
    data = resolve_preset(section, cluster_presets(), field)
    if isinstance(section, dict) and "preset" in section:
        data["name"] = section["preset"]
    nodes = data.pop("nodes", None)
    if nodes is not None:
        if "gpus" in (section or {}):
            raise ScenarioError(f"{field}.nodes", f"give {field}.gpus or {field}.nodes, not both")
        data["gpus"] = _validate_nodes(nodes, field) * data.get("gpus_per_node", 8)
    data["gpu"] = _resolve_gpu(data.get("gpu"), field)
    keys = CLUSTER_KEYS if field == "cluster" else POOL_KEYS
    return _validate(ClusterSpec, data, field, keys)


def _build_pools(section: dict, field: str) -> PooledCluster:
    """``{pools: [...], name?, gpus?}``: each pool a cluster section of its own; ``gpus``, if
    given, must be the pools' sum. Everything else belongs inside a pool."""
    if field != "cluster":
        raise ScenarioError(f"{field}.pools", "a pool cannot hold pools")
    for key in section:
        if key not in ("pools", "name", "gpus"):
            raise ScenarioError(f"{field}.{key}", "set it inside each pool (cluster.pools.N."
                                f"{key}); beside pools a cluster takes only name and gpus")
    pools = section["pools"]
    if not isinstance(pools, list) or not pools:
        raise ScenarioError(f"{field}.pools", "expected a non-empty list of cluster sections")
    built = [build_cluster(pool, f"{field}.pools.{i}") for i, pool in enumerate(pools)]
    cluster = _validate(PooledCluster, {"pools": built, "name": section.get("name", "pools")},
                        field, ["pools", "name", "gpus"])
    gpus = section.get("gpus")
    if gpus is not None and gpus != cluster.gpus:
        sizes = " + ".join(str(pool.gpus) for pool in built)
        raise ScenarioError(f"{field}.gpus", f"is {gpus!r}, but the pools hold {sizes} = "
                                             f"{cluster.gpus} GPUs")
    return cluster


def _resolve_gpu(gpu: Any, field: str = "cluster") -> Any:
    """A GPU named by catalogue id, or a mapping with an optional ``preset`` id."""
    if isinstance(gpu, str):
        gpu = {"preset": gpu}
    if not isinstance(gpu, dict):
        return gpu  # let the ClusterSpec validation name the problem
    resolved = resolve_preset(gpu, gpu_presets(), f"{field}.gpu")
    if "preset" in gpu:
        resolved.setdefault("id", gpu["preset"])
    return resolved


def _validate_nodes(nodes: Any, field: str = "cluster") -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes <= 0:
        raise ScenarioError(f"{field}.nodes", f"expected a positive integer, got {nodes!r}")
    if nodes > MAX_COUNT:
        raise ScenarioError(f"{field}.nodes", f"must be at most {MAX_COUNT:,}, "
                                              f"{LIMIT_REASONS[MAX_COUNT]} (got {nodes!r})")
    return nodes


def _validate(cls: type[BaseModel], data: Any, field: str,
              keys: list[str] | None = None) -> Any:
    if not isinstance(data, dict):
        raise ScenarioError(field, f"expected a mapping, got {type(data).__name__}")
    allowed = {**SECTION_KEYS, "cluster": CLUSTER_KEYS}
    if keys is not None:
        allowed[field] = keys
    if cls is ClusterSpec:  # a GPU may name a catalogue preset (_resolve_gpu) besides its fields
        allowed[f"{field}.gpu"] = ["preset", *GpuSpec.model_fields]
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=field, allowed=allowed, model=cls) from None
