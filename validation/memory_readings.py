"""Published peak-memory readings against clustersim's predicted peak.

Throughput tables are the rest of the held-out data (``published.py``); a few sources also
print each run's memory. torchtitan's H100 benchmarks (``tests/data/memory-torchtitan-h100.yaml``)
log the PyTorch caching allocator's peak reserve, which holds the allocated peak clustersim
predicts plus the allocator's cache: a prediction is right when it lies a little under the
reading, never over it. The development set's BLOOM sweep (``tests/data/published-dev.yaml``,
``measured.memory_gb``) prints nvidia-smi's memory in use on the first and last nodes, which
holds all that and the CUDA context and NCCL's buffers too: the allocated peak plus the
process's runtime (``runtime_bytes``) lies under it. These readings fitted nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.yamlio import load_yaml_file

from .devset import base_scenario

GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One published run's memory, in GiB: the peak reserve it printed (``load_readings``),
    or nvidia-smi's memory in use (``load_used``: nvidia-smi counts MiB, the BLOOM chronicles
    round them to "GB", 77 of an 80 GB card's 79.2 at most)."""

    id: str
    scenario: dict
    gib: float


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """A reading beside what the engine predicts of it, in GiB: the allocated peak on the
    busiest rank (against a reserve), plus the process's runtime (against nvidia-smi's use)."""

    reading: MemoryReading
    predicted_gib: float

    @property
    def ratio(self) -> float:
        """Predicted over published: at most 1 where the prediction is right (under 1 by the
        allocator's cache, and against nvidia-smi NCCL's buffers)."""
        return self.predicted_gib / self.reading.gib


def load_readings(path: Path) -> list[MemoryReading]:
    """The readings of one data file, in its order."""
    return [MemoryReading(raw["id"], raw["scenario"], float(raw["published"]["max_reserved_gib"]))
            for raw in load_yaml_file(path)]


def compare(readings: list[MemoryReading], fidelity: str = "representative",
            loss_kernel: str | None = None) -> list[MemoryRow]:
    """Each reading with the engine's predicted peak memory of its scenario (with
    ``training.loss_kernel`` set to ``loss_kernel`` where given: what another loss would
    say)."""
    return [MemoryRow(r, simulate(_built(r.scenario, loss_kernel), fidelity).peak_bytes / GIB)
            for r in readings]


def _built(raw: dict, loss_kernel: str | None):
    if loss_kernel is None:
        return build_scenario(raw)
    return build_scenario({**raw, "training": {**raw["training"], "loss_kernel": loss_kernel}})


def load_used(path: Path) -> list[MemoryReading]:
    """The runs of a development-set file that print ``measured.memory_gb``, as run (the
    published recomputation), in the file's order."""
    readings = []
    for raw in load_yaml_file(path):
        used, scenario = raw["measured"].get("memory_gb"), base_scenario(raw)
        if used is not None and scenario is not None:
            readings.append(MemoryReading(raw["id"], scenario, float(used)))
    return readings


def compare_used(readings: list[MemoryReading],
                 fidelity: str = "representative") -> list[MemoryRow]:
    """Each reading beside the allocated peak of its scenario plus its GPU's runtime."""
    rows = []
    for r in readings:
        s = build_scenario(r.scenario)
        held = simulate(s, fidelity).peak_bytes + s.cluster.gpu.runtime_bytes
        rows.append(MemoryRow(r, held / GIB))
    return rows
