"""Published times of one transformer layer against the cost model's layer.

End-to-end tables mix a layer's cost with the bubble, the optimizer and the output layer; a
source that times one layer's forward and backward (Korthikanti et al. 2022, Table 4:
``tests/data/layer-times-korthikanti2022.yaml``) checks the layer alone, and its rows differ
by one setting each (sequence parallelism, full or selective recomputation), so each row's
overhead over the baseline checks what the model charges for that setting. The model's layer
is what both estimators charge per layer and micro-batch: its compute
(``cost_model.layer_times``) and its exposed tensor-parallel communication
(``CostModel.per_layer_comm``), forward and backward. These times fitted nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.yamlio import load_yaml_file


@dataclass(frozen=True, slots=True)
class LayerTiming:
    """One published row: the layer's forward and backward in milliseconds, and the scenario
    it was run in."""

    experiment: str
    scenario: dict
    forward_ms: float
    backward_ms: float

    @property
    def combined_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@dataclass(frozen=True, slots=True)
class LayerRow:
    """A published row beside the model's forward and backward of the same layer, in ms."""

    timing: LayerTiming
    forward_ms: float
    backward_ms: float

    @property
    def combined_ms(self) -> float:
        return self.forward_ms + self.backward_ms

    @property
    def error(self) -> float:
        """Predicted over published combined time, less one (above zero: predicted slow)."""
        return self.combined_ms / self.timing.combined_ms - 1


def load_timings(path: Path) -> list[LayerTiming]:
    """The rows of one data file, in its order, each with its whole scenario."""
    raw = load_yaml_file(path)
    base = raw["scenario"]
    return [LayerTiming(row["experiment"],
                        {**base, "parallel": {**base["parallel"], **row["parallel"]}},
                        float(row["forward_ms"]), float(row["backward_ms"]))
            for row in raw["rows"]]


def predicted_layer_ms(scenario: dict) -> tuple[float, float]:
    """The model's (forward, backward) of one layer and micro-batch on one rank, in ms:
    compute plus exposed TP communication; backward includes recomputation."""
    cm = CostModel(build_scenario(scenario))
    forward, backward, _ = cm.per_layer
    comm_forward, comm_backward = cm.per_layer_comm
    return 1e3 * (forward + comm_forward), 1e3 * (backward + comm_backward)


def compare(timings: list[LayerTiming]) -> list[LayerRow]:
    """Each published row with the model's layer in its scenario."""
    return [LayerRow(t, *predicted_layer_ms(t.scenario)) for t in timings]


def overhead(combined_ms: float, baseline_ms: float) -> float:
    """A row's combined time over the baseline's, less one (Table 4's "Overhead")."""
    return combined_ms / baseline_ms - 1
