"""The stragglers and link-jitter figures docs/predictions.md quotes, from the shipped example.

    python3 benchmarks/straggler_figures.py

``examples/stragglers-llama3-70b.yaml`` (Llama 3 70B on 1,024 H100, a 2% compute spread and
0.1% of GPUs 1.5x slower) against identical GPUs, then the same job with link jitter alone
(``cluster.variability.link_sigma``) in representative and in full fidelity (one seed; full
draws every port and simulates every GPU). docs/predictions.md holds this script's output
(``benchmarks/doc_outputs.py`` reruns it; a test fails when it is stale).
"""

from __future__ import annotations

from pathlib import Path

import clustersim

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "stragglers-llama3-70b.yaml"


def step(fidelity: str = "representative", variability: dict | None = None,
         example: bool = False):
    """The example's step (``example``: with its own variability), or with ``variability``."""
    if example:
        return clustersim.simulate(EXAMPLE, fidelity=fidelity)
    return clustersim.simulate(EXAMPLE, fidelity=fidelity, cluster__variability=variability)


def line(label: str, result, base=None) -> str:
    """A label, the step and its exposed communication (and their growth over ``base``)."""
    s, c = result.step_time_s, result.result.breakdown.exposed_comm
    grown = "" if base is None else (f"  step {s / base.step_time_s - 1:+6.1%}, exposed "
                                     f"{c / base.result.breakdown.exposed_comm - 1:+6.1%}")
    return f"{label:44s} step {s:6.2f} s  exposed comm {c:5.2f} s{grown}"


def main() -> None:
    identical = step()
    print(line("identical GPUs, representative", identical))
    print(line("the example's stragglers, representative", step(example=True), identical))
    for sigma in (0.05, 0.1):
        print(line(f"link jitter sigma {sigma}, representative",
                   step(variability={"link_sigma": sigma}), identical))
    healthy = step("full")
    print(line("identical GPUs, full", healthy))
    print(line("link jitter sigma 0.05, full (one seed)",
               step("full", {"link_sigma": 0.05}), healthy))


if __name__ == "__main__":
    main()
