"""Layers per pipeline stage that even out stages of unequal speed (a cluster of pools).

A 1F1B-family step is about ``m * T_max`` plus the fill and drain (``analytic.py``), so the
split that minimises the slowest stage's time per micro-batch, ``T_i = n_i t_i + e_i`` with
``t_i`` one layer's forward, backward and exposed communication on stage ``i``'s GPUs and
``e_i`` what the stage runs besides its layers (the output layer and loss on the head stage),
is the balanced one: more layers on faster GPUs, about in proportion to their speed. Layers
are handed out one at a time to the stage that would be done soonest with one more
(water-filling), which minimises ``max T_i`` for such linear costs; every chunk keeps at least
one layer. Megatron-LM takes such uneven splits as ``--pipeline-model-parallel-layout``
("essential for balanced partitioning for an imbalanced model", its
docs/api-guide/pipeline_parallel_layout.md).
"""

from __future__ import annotations

from clustersim.topologies.profile import Profile

from ..costs import compute
from ..costs.stage_costs import StageCosts
from ..inputs import variability
from ..inputs.scenario import Scenario
from ..pipeline.stages import even_split, head_stage, scenario_chunk_stages


def stage_costs_per_layer(s: Scenario, profile: Profile | None = None
                          ) -> tuple[list[float], list[float]]:
    """Per stage: (one layer's seconds per micro-batch, the seconds of its other work)."""
    costs = StageCosts(s, profile)
    per_layer, fixed = [], []
    for stage in range(s.parallel.pp):
        cm = costs.stage(stage)
        slowest = variability.expected_max(cm.s.cluster.variability, cm.s.cluster.gpus)
        forward, backward, comm = cm.per_layer
        per_layer.append((forward + backward) * slowest + comm)
        fixed.append(sum(compute.logits_times(cm)) * slowest if stage == head_stage(s) else 0.0)
    return per_layer, fixed


def water_fill(layers: int, per_layer: list[float], fixed: list[float],
               least: int = 1) -> list[int]:
    """``layers`` split so that ``max(n_i per_layer_i + fixed_i)`` is smallest, ``n_i >=
    least``: each next layer goes to the stage that would finish soonest with it (ties to
    the earlier stage)."""
    counts = [least] * len(per_layer)
    for _ in range(layers - least * len(per_layer)):
        i = min(range(len(counts)), key=lambda k: (counts[k] + 1) * per_layer[k] + fixed[k])
        counts[i] += 1
    return counts


def balanced_stage_layers(s: Scenario, profile: Profile | None = None) -> list[int]:
    """``parallel.stage_layers`` of ``s`` balanced over its stages' speeds: one entry per
    stage, or per chunk (``pp * virtual_stages``, model order) when a stage runs several."""
    p = s.parallel
    per_layer, fixed = stage_costs_per_layer(s, profile)
    totals = water_fill(s.model.layers, per_layer, fixed, least=p.virtual_stages)
    if p.virtual_stages == 1:
        return totals
    shares = [even_split(n, p.virtual_stages) for n in totals]
    taken = [0] * p.pp
    chunks = []
    for stage in scenario_chunk_stages(s):  # each stage's chunks take its layers in order
        chunks.append(shares[stage][taken[stage]])
        taken[stage] += 1
    return chunks
