"""Derive the shipped GPU profiles from kernel-level measurements, and check them.

    python -m clustersim.validation.derive_profiles            # print what differs
    python -m clustersim.validation.derive_profiles --write    # rewrite topologies/profiles

Every constant of a shipped GPU profile comes from ``topologies/measurements/kernels.yaml``:
the GEMM ceiling from the best measured matmul (over its shape's tile and wave quantisation,
``simulator/model/kernels.py``, so the model reproduces the measurement at that shape), fused
attention and HBM fractions, NCCL link fractions, and the compute lost beside a collective.
Two overheads per GPU are fitted end-to-end, on the one published table the file names, and
nothing else: the host's work once a step (``step_overhead_s``, from a grid) and the fraction of
isolated speed kernels keep through a step (``sustained_fraction``, solved so the median log
error of the engine's predictions of the table is zero). A GPU ``derived_from`` another takes
its figures and fitted overheads and overrides what it measured itself.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from functools import cache
from importlib.resources import files
from pathlib import Path

import yaml

from clustersim.simulator.closed_form.analytic import estimate
from clustersim.simulator.discrete_event.engine import simulate
from clustersim.simulator.model.kernels import Gemm, quantisation
from clustersim.topologies.hardware import GpuSpec, gpu_presets
from clustersim.topologies.profile import Profile

from . import published as pub
from . import sweeps

TILES = [[128, 256], [256, 128], [128, 128]]  # the tiles cuBLAS picks among (kernels.py)
OVERHEADS = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2)  # host seconds per step
TABLES = Path(__file__).resolve().parent.parent / "tests" / "data"
PROFILES = Path(__file__).resolve().parent.parent / "topologies" / "profiles"


def measurements() -> dict:
    """The kernel measurements file, GPU id -> entry."""
    text = files("clustersim.topologies").joinpath("measurements/kernels.yaml").read_text()
    return yaml.safe_load(text)


def gemm_ceiling(gpu_id: str, matmul: dict, k_overhead: float,
                 precision: str = "bf16") -> float:
    """The large-GEMM fraction of peak that makes the kernel model reproduce the measured
    best matmul at its shape: measured fraction over that shape's quantisation and its K
    loop's share (``k / (k + k_overhead)``, ``compute.gemm_time``)."""
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    measured = matmul["tflops"] * 1e12 / gpu.peak_flops[precision]
    m, n, k = matmul["shape"]
    share = quantisation(Gemm(m, n, k), gpu.sm_count, TILES) * k / (k + k_overhead)
    return round(measured / share, 3)


def measured_profile(gpu_id: str, entry: dict, table: dict, name: str | None = None) -> dict:
    """A profile from the measurements alone, before its overheads are fitted."""
    entry = {**entry, "gemm_fixed": gemm_fixed(entry)}
    slowdown = entry["overlap_slowdown"]["fraction"]
    k_overhead = entry["gemm_fixed"]["k_overhead"]
    ceiling = entry["matmul_ceiling"]["fraction"] if "matmul_ceiling" in entry \
        else gemm_ceiling(gpu_id, entry["matmul"], k_overhead)
    profile = {
        "name": name or gpu_id, "gpu": gpu_id,
        "memory_efficiency": entry["hbm"]["fraction"],
        "comm_efficiency": {k: v for k, v in entry["comm"].items() if k != "source"},
        "gemm": {"ceiling": ceiling, "k_overhead": k_overhead, "tiles": TILES,
                 **_fp8_ceiling(gpu_id, entry, ceiling, k_overhead),
                 "fixed_s": entry["gemm_fixed"]["seconds"]},
        **_attention(entry["attention"]),
        # compute 1 + s times longer beside a collective keeps 1/(1 + s) of its throughput
        "comm_compute_slowdown": round(1 - 1 / (1 + slowdown), 3),
        # launches overlap the GPU's work while the host runs ahead: the host's cost is
        # the step's (step_overhead_s), not each kernel's, until a layer's kernels are
        # shorter than its launches (host_layer_s, measured on our own GPUs' hosts)
        "kernel_overhead_s": 0.0,
        "host_layer_s": sweeps.host_layer_seconds()["seconds"],
        "uncertainty": dict(entry.get("uncertainty", {})),
        "fitted_on": [table["table"]],
    }
    profile["source"] = _source(entry, table)
    return profile


def gemm_fixed(entry: dict) -> dict:
    """The GEMM kernels' fixed costs (``seconds`` per kernel, ``k_overhead`` per output tile,
    ``source``): the entry's own, or the fit of the sweeps it names (``gemm_fixed: {gpu,
    sweeps}``), the kernel time alone where ``per_tile: false`` (another architecture, whose
    GEMM pipelines those sweeps do not measure): no per-shape timings are published beside
    the best-matmul figures."""
    fixed = entry["gemm_fixed"]
    if "sweeps" not in fixed:
        return fixed
    summary = sweeps.summary(fixed["gpu"], fixed["sweeps"])
    return summary["gemm_fixed" if fixed.get("per_tile", True) else "gemm_fixed_time_only"]


def _fp8_ceiling(gpu_id: str, entry: dict, bf16_ceiling: float, k_overhead: float) -> dict:
    """``fp8_ceiling``, on the same footing as ``bf16_ceiling``: our sweeps' typical FP8 GEMM
    (``sweeps.py``); or the bf16 ceiling times the ratio of FP8's typical fraction of its peak
    to bf16's, both from our sweeps of the GPU (``footing``): a published bf16 figure that is
    the best of a brute-force search (MAMF) and a one-shape FP8 figure are not alike, and the
    fitted ``sustained_fraction``, from bf16 runs, would charge FP8 the gap between bf16's best
    and typical twice; or the published FP8 figure itself. None where nothing is measured."""
    if "fp8_ceiling" in entry:
        return {"fp8_ceiling": entry["fp8_ceiling"]["fraction"]}
    if "fp8_matmul" not in entry:
        return {}
    if "footing" in entry["fp8_matmul"]:
        own = sweeps.summary(gpu_id, entry["fp8_matmul"]["footing"])
        ratio = own["fp8_ceiling"]["fraction"] / own["matmul_ceiling"]["fraction"]
        return {"fp8_ceiling": round(bf16_ceiling * ratio, 3)}
    return {"fp8_ceiling": gemm_ceiling(gpu_id, entry["fp8_matmul"], k_overhead, "fp8")}


def _attention(families: dict) -> dict:
    """Fused attention's fields: every measured family at long sequences, the default flash3
    where measured, and the default family's fixed work as keys."""
    measured = {name: long_sequence(name, f) for name, f in families.items() if "of" not in f}
    relative = {name: slower_family(measured[f["of"]], f["speedup"])
                for name, f in families.items() if "of" in f}
    long = dict(sorted({**measured, **relative}.items()))
    default = long.get("flash3") or long["flash2"]
    return {"attention_efficiency": default[0], "attention_backward_efficiency": default[1],
            "attention_by_kernel": {name: [f[0], f[1]] for name, f in long.items()},
            "attention_overhead_tokens": default[2],
            "attention_overhead_by_kernel": {name: f[2] for name, f in long.items()}}


def slower_family(base: tuple[float, float, list[float]],
                  speedup: list[float]) -> tuple[float, float, list[float]]:
    """A family published only as how much faster ``base``'s family runs (forward, backward):
    ``base``'s long-sequence fractions over those factors, with ``base``'s fixed work."""
    forward, backward, fixed = base
    return round(forward / speedup[0], 3), round(backward / speedup[1], 3), fixed


def long_sequence(family: str, figures: dict) -> tuple[float, float, list[float]]:
    """(forward, backward, fixed work as keys) of one attention family: our sweeps' fit as
    it is, or a published figure measured at ``at_tokens`` keys raised to the long-sequence
    fraction by the fixed work our sweeps measured for the same family (``overhead``)."""
    if "overhead_tokens" in figures:
        return figures["forward"], figures["backward"], figures["overhead_tokens"]
    if "overhead" not in figures:
        return figures["forward"], figures["backward"], [0.0, 0.0]
    source = figures["overhead"]
    fixed = sweeps.attention_overhead(source["sweeps"], source["gpu"], family)
    at = figures["at_tokens"]
    return (round(figures["forward"] * (at + fixed[0]) / at, 3),
            round(figures["backward"] * (at + fixed[1]) / at, 3), fixed)


def _source(entry: dict, table: dict) -> str:
    parts = [f"{key}: {entry[key]['source']}" for key in
             ("matmul", "matmul_ceiling", "gemm_fixed", "fp8_matmul", "fp8_ceiling", "hbm",
              "comm", "overlap_slowdown")
             if key in entry]
    parts += [f"attention {name}: {f['source']}" for name, f in entry["attention"].items()]
    parts.append(f"host_layer_s: {sweeps.host_layer_seconds()['source']}")
    parts.append(f"step_overhead_s and sustained_fraction fitted on {table['table']} "
                 f"(tests/data/{table['table']}.yaml): {table['why']}")
    return " | ".join(parts) + " (derived by validation/derive_profiles.py from " \
        "topologies/measurements/kernels.yaml)"


def sweep_entry(entry: dict, data: dict) -> dict:
    """A measurements entry from our own sweeps of one GPU; what one GPU cannot measure
    (NCCL links, the slowdown beside a collective, the fitted table) is ``links_from``'s."""
    base = data[entry["links_from"]]
    own = sweeps.summary(entry["gpu"], entry["sweeps"])
    kept = {k: base[k] for k in ("comm", "overlap_slowdown", "uncertainty", "fitted")
            if k in base}
    return {**kept, **own, "attention": {**base["attention"], **own["attention"]}}


def _log_errors(profile: dict, cases: list, predict=None) -> list[float]:
    """Each row's log error (predicted over published) under ``profile``; the closed-form
    estimate unless ``predict`` is given."""
    model = Profile.model_validate(profile)
    return [math.log(row.predicted / row.case.published)
            for row in pub.predict_rows(cases, model, predict or (lambda s, p: estimate(s, p)))]


def _engine(scenario, profile):
    return simulate(scenario, "representative", profile)


def _fraction_for(profile: dict, cases: list, overhead: float,
                  engine_gap: list[float]) -> float:
    """The sustained fraction at which the table's median log error is zero: bisection on
    the closed form, each row shifted by ``engine_gap`` (the engine's log prediction over
    the closed form's, nearly independent of the fraction)."""
    lo, hi = 0.5, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        errs = [e + g for e, g in zip(_log_errors(
            {**profile, "step_overhead_s": overhead, "sustained_fraction": mid}, cases),
            engine_gap, strict=True)]
        # the metric is throughput: a faster GPU predicts more, so a positive median is
        # too fast a GPU
        lo, hi = (lo, mid) if statistics.median(errs) > 0 else (mid, hi)
    return round((lo + hi) / 2, 3)


def fit_overheads(profile: dict, table: str, parallel: dict | None = None,
                  training: dict | None = None) -> tuple[float, float]:
    """(step_overhead_s, sustained_fraction) at which the engine's predictions of the
    table have the least absolute log error, with the fraction solved for a zero median;
    ``parallel``, ``training``: fields set on every row (``published.load_table``'s what-if).

    The engine, not the closed form, because it makes the predictions the profile is for
    (the two differ by a few percent on interleaved schedules). The median and the absolute
    error, not the mean and the square, so that a row the model cannot explain (an
    unpublished setting, a slow node) does not move every prediction: the two overheads are
    what every run pays. The engine is slow on the largest rows, so each search runs on the
    closed form shifted row by row by the engine's gap, and the gap is measured again at the
    answer until the fraction stops moving (twice or three times)."""
    cases = pub.load_table(TABLES / f"{table}.yaml", parallel, training)
    gap = [0.0] * len(cases)
    fitted = None
    for _ in range(4):
        best = None
        for overhead in OVERHEADS:
            fraction = _fraction_for(profile, cases, overhead, gap)
            errs = _log_errors({**profile, "step_overhead_s": overhead,
                                "sustained_fraction": fraction}, cases)
            score = sum(abs(e + g) for e, g in zip(errs, gap, strict=True))
            if best is None or score < best[0]:
                best = (score, overhead, fraction)
        if best[1:] == fitted:
            break
        fitted = best[1:]
        at = {**profile, "step_overhead_s": fitted[0], "sustained_fraction": fitted[1]}
        gap = [e - c for e, c in zip(_log_errors(at, cases, _engine), _log_errors(at, cases),
                                     strict=True)]
    return fitted


@cache
def derive_all() -> dict[str, dict]:
    """Every GPU profile the measurements file describes, by profile name."""
    data = measurements()
    out: dict[str, dict] = {}
    for name, entry in data.items():
        if "derived_from" in entry:
            continue
        gpu_id = entry.get("gpu", name)
        if "sweeps" in entry:
            entry = sweep_entry(entry, data)
        profile = measured_profile(gpu_id, entry, entry["fitted"], name)
        if "overheads_from" in data[name]:  # no training table of its own GPU to fit on
            base = out[data[name]["overheads_from"]]
            overhead, fraction = base["step_overhead_s"], base["sustained_fraction"]
            profile["fitted_on"] = base["fitted_on"]
            profile["source"] += f" | step_overhead_s and sustained_fraction: {base['name']}'s"
        else:
            overhead, fraction = fit_overheads(profile, entry["fitted"]["table"])
        out[name] = {**profile, "step_overhead_s": overhead, "sustained_fraction": fraction}
    for gpu_id, entry in data.items():
        if "derived_from" in entry:
            out[gpu_id] = derived_profile(gpu_id, entry, out[entry["derived_from"]])
    return out


def derived_profile(gpu_id: str, entry: dict, base: dict) -> dict:
    """``base``'s figures and fitted overheads on another GPU, with what it measured itself."""
    profile = {**base, "name": gpu_id, "gpu": gpu_id, "derived_from": base["name"]}
    profile.pop("measured_here", None)  # the base's own figures are not this GPU's
    measured_here = [word for key, word in (("matmul", "GEMMs"), ("attention", "attention"))
                     if key in entry]
    if measured_here:
        profile["measured_here"] = measured_here
    note = f"derived from {base['name']}: its measured fractions and fitted overheads"
    if "matmul" in entry:
        profile["gemm"] = {**profile["gemm"], "ceiling": gemm_ceiling(
            gpu_id, entry["matmul"], profile["gemm"]["k_overhead"])}
        note += f"; matmul: {entry['matmul']['source']}"
    if "fp8_matmul" in entry:  # a brute-force best like its bf16 one: the same footing
        profile["gemm"] = {**profile["gemm"],
                           "fp8_ceiling": gemm_ceiling(gpu_id, entry["fp8_matmul"],
                                                       profile["gemm"]["k_overhead"], "fp8")}
        note += f"; fp8_matmul: {entry['fp8_matmul']['source']}"
    if "attention" in entry:
        base_families = measurements()[entry["derived_from"]].get("attention", {})
        profile.update(_own_attention(base, entry["attention"], base_families))
        note += "".join(f"; attention {name}: {f['source']}"
                        for name, f in entry["attention"].items())
    if "matmul_sweeps" in entry:  # our sweeps of both GPUs: the base's ceiling times their ratio
        k_overhead = base["gemm"]["k_overhead"]
        own = sweeps.matmul_ceiling(gpu_id, entry["matmul_sweeps"]["own"], k_overhead)
        theirs = sweeps.matmul_ceiling(base["gpu"], entry["matmul_sweeps"]["base"], k_overhead)
        ratio = own["fraction"] / theirs["fraction"]
        profile["gemm"] = {**base["gemm"], "ceiling": round(base["gemm"]["ceiling"] * ratio, 3)}
        note += f"; matmul: {base['name']}'s ceiling x {ratio:.4f}, the ratio of {own['source']}" \
                f" to {theirs['source']}"
    profile["source"] = note + f" | {base['name']}'s sources: {base['source']}"
    return profile


def _own_attention(base: dict, families: dict, base_families: dict) -> dict:
    """``base``'s attention fields with the families this GPU measured itself replaced; a
    family the base publishes only against another (``of``) that this GPU measured is taken
    against this GPU's figures, as the base takes it against its own."""
    relative = {name: f for name, f in base_families.items()
                if "of" in f and name not in families and f["of"] in families}
    own = _attention({**families, **relative})
    by_kernel = {**base["attention_by_kernel"], **own["attention_by_kernel"]}
    fixed = {**base["attention_overhead_by_kernel"], **own["attention_overhead_by_kernel"]}
    default = "flash3" if "flash3" in by_kernel else "flash2"
    return {"attention_efficiency": by_kernel[default][0],
            "attention_backward_efficiency": by_kernel[default][1],
            "attention_by_kernel": dict(sorted(by_kernel.items())),
            "attention_overhead_tokens": fixed[default],
            "attention_overhead_by_kernel": dict(sorted(fixed.items()))}


def own_measurements(name: str) -> dict:
    """The measurements a profile's figures come from: its base's, down a ``derived_from``
    chain, with what each GPU on the way measured itself (GEMMs, attention families)."""
    data = measurements()
    entry = data[name]
    if "derived_from" not in entry:
        return sweep_entry(entry, data) if "sweeps" in entry else entry
    base = own_measurements(entry["derived_from"])
    merged = {**base, **{k: entry[k] for k in ("matmul", "fp8_matmul") if k in entry}}
    merged["attention"] = {**base["attention"], **entry.get("attention", {})}
    return merged


def differences() -> list[str]:
    """The shipped profiles that differ from what the measurements derive."""
    out = []
    for gpu_id, profile in derive_all().items():
        path = PROFILES / f"{gpu_id}.json"
        shipped = json.loads(path.read_text()) if path.is_file() else None
        if shipped != profile:
            out.append(gpu_id)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the shipped profiles")
    args = parser.parse_args(argv)
    for gpu_id, profile in derive_all().items():
        print(f"{gpu_id:10s} ceiling {profile['gemm']['ceiling']:.3f}  step_overhead_s "
              f"{profile['step_overhead_s']:.3f}  sustained_fraction "
              f"{profile['sustained_fraction']:.3f}  fitted on {', '.join(profile['fitted_on'])}")
        if args.write:
            (PROFILES / f"{gpu_id}.json").write_text(json.dumps(profile, indent=2) + "\n")
    stale = [] if args.write else differences()
    if stale:
        print(f"stale shipped profiles: {', '.join(stale)} (run with --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
