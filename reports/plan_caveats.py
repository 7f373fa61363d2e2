"""Which of a plan's features have a cost the model cannot yet vouch for, and how much of the
plan's lead they carry.

Three features a plan may choose are charged by the model on evidence that falls short of a
kernel-level measurement on the GPU it plans for (``docs/planner.md``, "Caveats"):

* ``tp_comm_overlap``: the TP collectives hide behind the GEMMs, which run slower meanwhile by
  the profile's ``comm_compute_slowdown``: a published A100 figure, inside what our H200
  measured beside a copy kernel on 8-32 SMs, never timed beside NCCL on the GPU planned for;
* ``split_backward`` (the zero-bubble and DualPipe schedules): charged for the cover its input
  halves lose and the memory its weight halves keep (``simulator/costs/split_backward.py``); the
  split's compute measured free on one layer of one H200 (``benchmarks/gpu_layers.py``), none
  published, and Megatron-LM's main line runs no such schedule;
* ``fp8``: GEMMs at the FP8 peak times the fraction of it bf16 reaches where the profile has
  no FP8 ceiling of its own, and no cost for the scaling factors' upkeep;
* ``a2a_overlap`` (combined 1F1B): each steady forward and backward hide one another's expert
  all-to-alls at their best, as a perfect split of the two into sub-chunks would, which no
  published A/B of Megatron-Core's combined 1F1B measures.

For each such feature of a plan the engine runs the same split without it (overlap off;
1F1B, or interleaved with the same chunks, for a split-backward schedule or combined 1F1B;
bf16 for fp8). The
plan *rests on* the feature when the split without it would rank below the next plan shown,
or does not fit or run at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.inputs.placement import expert_levels
from clustersim.simulator.inputs.scenario import Scenario, apply_values, build_scenario
from clustersim.simulator.pipeline.schedules import splits_backward

if TYPE_CHECKING:
    from clustersim.topologies.profile import Profile

    from .plan import Plan

NOTES = {
    "tp_comm_overlap": "TP collectives hidden behind the GEMMs; the GEMMs' slowdown beside "
                       "NCCL (comm_compute_slowdown) is a published A100 figure, bracketed on "
                       "our H100s and H200s by a copy kernel, not timed beside NCCL per GPU",
    "split_backward": "backward split into input and weight halves; charged the TP cover and "
                      "the memory the split costs; its compute measured free on H100s and H200s, "
                      "none published, and Megatron-LM's main line does not run it",
    "fp8": "FP8 GEMMs at bf16's fraction of the FP8 peak where none was measured; scaling "
           "upkeep (amax reductions, casts beyond the GEMM inputs) not charged",
    "a2a_overlap": "expert all-to-alls hidden behind the other micro-batch's compute in "
                   "combined 1F1B's pairs at their best; no published A/B measures it",
}
LABELS = {"tp_comm_overlap": "tp-overlap", "split_backward": "split-bwd", "fp8": "fp8",
          "a2a_overlap": "a2a-overlap"}


@dataclass(frozen=True)
class Caveat:
    """One uncertain feature of a plan, and the same split's step without it."""

    feature: str  # tp_comm_overlap | split_backward | fp8 | a2a_overlap
    note: str  # why its cost is uncertain
    without: dict | None  # the fields the split runs with instead; None: none runs or fits
    step_time_without_s: float | None  # the engine's step of the split without it
    rests_on: bool  # without it the split ranks below the next plan, or does not run or fit

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self, step: float) -> str:
        """``tp-overlap +8.1%!``: the step's growth without the feature; ``!`` when the plan
        rests on it, ``n/a`` when the split does not run or fit without it."""
        change = ("n/a" if self.step_time_without_s is None
                  else f"{self.step_time_without_s / step - 1:+.1%}")
        return f"{LABELS[self.feature]} {change}{'!' if self.rests_on else ''}"


def uncertain_features(s: Scenario) -> list[str]:
    """The features of ``s`` whose cost is uncertain, in ``NOTES`` order."""
    used = {"tp_comm_overlap": s.parallel.tp_comm_overlap,
            "split_backward": splits_backward(s.parallel.schedule),
            "fp8": s.training.precision == "fp8",
            "a2a_overlap": s.parallel.schedule == "combined-1f1b" and s.parallel.ep > 1}
    return [f for f in NOTES if used[f]]


def alternatives(s: Scenario, feature: str) -> list[dict]:
    """Field values that run ``s`` without ``feature``, the closest first."""
    if feature == "tp_comm_overlap":
        return [{"parallel.tp_comm_overlap": False}]
    if feature == "fp8":
        return [{"training.precision": "bf16"}]
    v = s.parallel.virtual_stages
    whole = [{"parallel.schedule": "interleaved", "parallel.virtual_stages": v}] if v > 1 else []
    return [*whole, {"parallel.schedule": "1f1b", "parallel.virtual_stages": 1,
                     "parallel.stage_layers": None}]


def with_caveats(plans: list[Plan], reserve: float, profile: Profile | None = None
                 ) -> list[Plan]:
    """The plans, each with a ``Caveat`` per uncertain feature (engine runs without each,
    priced by ``profile``, else each GPU's shipped one)."""
    known = {_key(p.scenario.as_dict()): p.result for p in plans}
    out = []
    for i, p in enumerate(plans):
        nxt = plans[i + 1].result.step_time_s if i + 1 < len(plans) else None
        found = tuple(_caveat(p.scenario, f, reserve, nxt, known, profile)
                      for f in uncertain_features(p.scenario))
        out.append(replace(p, caveats=found))
    return out


def _caveat(s: Scenario, feature: str, reserve: float, nxt: float | None,
            known: dict, profile: Profile | None = None) -> Caveat:
    """``feature``'s caveat: the first alternative that builds and fits, simulated."""
    for values in alternatives(s, feature):
        raw = apply_values(s.as_dict(), {"name": f"{s.name} without {feature}", **values})
        if raw["parallel"].get("stage_layers") is None:
            raw["parallel"].pop("stage_layers", None)
        try:
            other = build_scenario(raw)
        except ScenarioError:
            continue
        result = known.get(_key(other.as_dict())) or simulate(other, profile=profile)
        if result.fits_within(reserve):
            step = result.step_time_s
            return Caveat(feature, NOTES[feature], values, step,
                          nxt is not None and step > nxt)
    return Caveat(feature, NOTES[feature], None, None, True)


def _key(raw: dict) -> str:
    return repr({k: v for k, v in raw.items() if k != "name"})


def moe_routing_note(s: Scenario, subject: str = "#1") -> str | None:
    """What the held-out MoE runs say of a plan whose experts are spread over expert-parallel
    ranks (docs/accuracy.md, "Fine-grained MoE"; ``benchmarks/moe_routing.py``,
    ``benchmarks/deepseek_h100_recipe.py``): NVIDIA's Qwen3-30B-A3B, Qwen3-235B-A22B and
    DeepSeek-V3 runs on H100 and B200, each as its recipe ran it, ran at 0.72-0.97 of the
    predicted speed, inside a node and across up to 8; two releases of Qwen3-30B-A3B dropless
    at 0.38-0.45, and the patch release after them ran the same split 1.77x faster. Nothing is
    charged for the difference (no published figure times it), so the note says which way to
    read the step. ``subject`` names what spreads them: the plan (``#1``) or ``simulate``'s
    scenario."""
    m, p = s.model, s.parallel
    if m.experts == 1 or p.ep == 1:
        return None
    routing = ("dropless (capacity_factor null)" if m.capacity_factor is None
               else f"dropping tokens (capacity_factor {m.capacity_factor:g})")
    _, nodes = expert_levels(s)
    sent = ("" if nodes == 1 else
            f" across {nodes} nodes, " + ("as DeepEP sends them"
                                          if p.moe_dispatcher == "deepep" else
                                          "as Megatron-Core's alltoall dispatcher sends them"))
    return (f"{subject} spreads {m.experts} experts of {m.ffn_hidden} columns over {p.ep} "
            f"expert-parallel ranks{sent}, {routing}: NVIDIA's published MoE runs "
            "(Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3; H100, B200) ran at 72-97% of the "
            "speed predicted for them as their recipes ran (38-46% in two releases whose next "
            "patch ran the same split 1.8x faster; docs/accuracy.md, \"Fine-grained MoE\"); "
            "read its step as a lower bound.")
