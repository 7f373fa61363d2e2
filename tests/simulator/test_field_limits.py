"""Every number of a scenario is finite and within physical reach, and a number that is not
is refused naming its field (clustersim/fields.py; docs/scenario.md, "Numbers"; issue 24).

The fields are found from the specs themselves, so a numeric field added later without one of
the shared types fails here.
"""

from __future__ import annotations

import copy
import json
import types
import typing

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from clustersim.errors import ScenarioError
from clustersim.fields import MAX_TOKENS, PositiveFloat, PositiveInt, Tokens
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.inputs.specs import ModelSpec, ParallelSpec, TrainingSpec
from clustersim.topologies.hardware import (
    GpuSpec,
    LinkFault,
    LinkTier,
    ScaleOutTier,
    SpineTier,
    Variability,
)

BASE = {
    "model": {"preset": "gpt-1.7b"},
    "cluster": {"preset": "dgx-a100-80gb", "gpus": 16,
                "gpu": {"preset": "a100-80gb"},
                "spine": {"bandwidth": 25, "latency": 5e-6, "pod_nodes": 1},
                "variability": {},
                "faults": [{"gpu": 0, "port": "nic", "bandwidth_factor": 0.5}]},
    "training": {"global_batch": 64},
    "parallel": {"tp": 1},
}
SECTIONS = [("model", ModelSpec), ("training", TrainingSpec), ("parallel", ParallelSpec),
            ("cluster.gpu", GpuSpec), ("cluster.intra_node", LinkTier),
            ("cluster.inter_node", ScaleOutTier), ("cluster.spine", SpineTier),
            ("cluster.variability", Variability), ("cluster.faults.0", LinkFault)]
CLUSTER_NUMBERS = ["cluster.gpus", "cluster.gpus_per_node"]
SEEDS = {"cluster.inter_node.ecmp_seed", "cluster.variability.seed"}  # labels, not quantities


def _numeric(annotation) -> str | None:
    """"scalar", "list" or "dict" if the field holds numbers that way, else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _numeric(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((kind for a in args if (kind := _numeric(a))), None)
    if origin is list:
        return "list" if _numeric(args[0]) == "scalar" else None
    if origin is dict:
        return "dict" if _numeric(args[1]) == "scalar" else None
    if annotation in (int, float):
        return "scalar"
    return None


def numeric_fields() -> list[tuple[str, str]]:
    found = [(path, "scalar") for path in CLUSTER_NUMBERS]
    for section, spec in SECTIONS:
        assert issubclass(spec, BaseModel)
        for name, info in spec.model_fields.items():
            kind = _numeric(info.annotation if not info.metadata
                            else typing.Annotated[(info.annotation, *info.metadata)])
            if kind:
                found.append((f"{section}.{name}", kind))
    return found


FIELDS = numeric_fields()


def set_value(raw: dict, path: str, kind: str, value) -> str:
    """Put ``value`` at ``path`` (in a list's first entry, or a dict's bf16 key); the dotted
    field an error about it must name."""
    *parents, key = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if kind == "list":
        node[key] = [value]
        return f"{path}.0"
    if kind == "dict":
        node[key] = {"bf16": value, "fp16": 1e12, "fp32": 1e12}
        return f"{path}.bf16"
    node[key] = value
    return path


def test_the_base_scenario_is_valid_and_the_fields_are_found():
    build_scenario(copy.deepcopy(BASE))
    paths = {path for path, _ in FIELDS}
    assert {"training.tokens", "training.global_batch", "model.hidden", "parallel.tp",
            "cluster.inter_node.latency", "cluster.gpu.peak_flops",
            "parallel.stage_layers"} <= paths
    assert len(paths) > 50


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 1e30],
                         ids=["inf", "-inf", "nan", "1e30"])
@pytest.mark.parametrize("path, kind", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_numeric_field_refuses_numbers_out_of_reach_naming_itself(path, kind, bad):
    if bad == 1e30 and path in SEEDS:
        pytest.skip("a seed only labels a draw: any integer is one")
    raw = copy.deepcopy(BASE)
    field = set_value(raw, path, kind, bad)
    with pytest.raises(ScenarioError) as info:
        build_scenario(raw)
    assert info.value.field == field, str(info.value)


@pytest.mark.parametrize("override, field", [
    ({"training": {"global_batch": 10**18}}, "training.global_batch"),  # issue 24: 1.3e16 s
    ({"training": {"global_batch": 64, "tokens": 2 * MAX_TOKENS}}, "training.tokens"),
    ({"cluster": {"preset": "dgx-a100-80gb", "nodes": 10**18}}, "cluster.nodes"),
    ({"cluster": {"preset": "dgx-a100-80gb", "gpus": 16,
                  "inter_node": {"bandwidth": 1e-300}}}, "cluster.inter_node.bandwidth"),
])
def test_values_beyond_any_physical_meaning_name_their_field(override, field):
    raw = {**copy.deepcopy(BASE), **override}
    with pytest.raises(ScenarioError) as info:
        build_scenario(raw)
    assert info.value.field == field, str(info.value)
    assert "must be at" in info.value.message


@pytest.mark.parametrize("kind, value, source", [
    (PositiveInt, 1024**2, "PEER's million experts, He 2024, arXiv 2407.04202"),
    (PositiveInt, 10_000_000, "Llama 4 Scout's 10M-token context, Meta 2025"),
    (PositiveInt, 65536, "LAMB's BERT batch of 64k sequences, You et al. 2019"),
    (PositiveInt, 100_000, "a 100k-GPU cluster"),
    (Tokens, 36e12, "Qwen3's 36T training tokens, arXiv 2505.09388"),
    (Tokens, 3e14, "the stock of public text, Villalobos et al. 2024"),
    (PositiveFloat, 5e15, "GB200's fp8 peak FLOP/s, topologies/gpus.yaml"),
    (PositiveFloat, 1e-7, "a 100 ns latency in seconds"),
])
def test_the_largest_real_values_are_within_reach(kind, value, source):
    assert TypeAdapter(kind).validate_python(value) == value, source


@pytest.mark.parametrize("kind, value", [(PositiveInt, True), (Tokens, float("inf")),
                                         (PositiveFloat, 0.0)])
def test_the_shared_types_refuse_booleans_infinities_and_zero(kind, value):
    with pytest.raises(ValidationError):
        TypeAdapter(kind).validate_python(value)


@pytest.mark.parametrize("table", ["matmul_efficiency", "matmul_efficiency_by_tokens"])
def test_a_profile_table_holds_finite_flops(tmp_path, table):
    """A profile file's ``Infinity`` (Python's json reads it) is no GEMM size."""
    from clustersim.topologies.profile import load_profile

    rows = [[1e8, 0.1], [float("inf"), 0.9]]
    data = {"name": "p", "gpu": "custom", "memory_efficiency": 0.8,
            "comm_efficiency": {"intra_node": 0.8, "inter_node": 0.8},
            table: rows if table == "matmul_efficiency" else [[2048, rows]]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))  # writes Infinity, as a careless tool would
    with pytest.raises(ScenarioError) as info:
        load_profile(path)
    assert info.value.field.startswith(f"profile.{table}"), str(info.value)
