"""Step-time inflation from stragglers as the job grows (README, "Stragglers").

    python examples/stragglers.py [OUT.png]

Llama 3 70B with examples/stragglers-llama3-70b.yaml's split, weak-scaled: 16 micro-batches
per pipeline at every size, so each GPU's work stays the same and only the number of GPUs a
step waits for grows (1,024 to 16,384). For each cluster.variability it predicts the step and
plots its inflation over identical GPUs; writes docs/stragglers.png by default.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import clustersim  # noqa: E402

HERE = Path(__file__).parent
SCENARIO = HERE / "stragglers-llama3-70b.yaml"
SIZES = (1024, 2048, 4096, 8192, 16384)
SPREADS = {
    "2% spread (sigma 0.02)": {"compute_sigma": 0.02},
    "2% spread + 0.1% of GPUs 1.5x slower": {"compute_sigma": 0.02, "slow_fraction": 0.001,
                                            "slow_factor": 1.5},
    "0.1% of GPUs 1.5x slower": {"slow_fraction": 0.001, "slow_factor": 1.5},
}
TP_PP = 8 * 4  # the scenario's tp x pp: one replica


def step(gpus: int, variability: dict | None) -> float:
    replicas = gpus // TP_PP
    return clustersim.simulate(SCENARIO, cluster__gpus=gpus, cluster__variability=variability,
                               training__global_batch=16 * replicas).step_time_s


def inflation_table(sizes=SIZES) -> dict[str, list[float]]:
    """Per variability, the step's inflation over identical GPUs at each size."""
    plain = [step(n, None) for n in sizes]
    return {label: [step(n, spec) / base - 1 for n, base in zip(sizes, plain, strict=True)]
            for label, spec in SPREADS.items()}


def main(out: Path) -> None:
    table = inflation_table()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in table.items():
        ax.plot(SIZES, [100 * v for v in values], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(SIZES, [f"{n:,}" for n in SIZES])
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("step time over identical GPUs (%)")
    ax.set_title("Stragglers: a synchronous step waits for its slowest GPU\n"
                 "Llama 3 70B, tp 8 pp 4, 16 micro-batches per pipeline", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    for label, values in table.items():
        print(f"{label}: " + ", ".join(f"{n:,} {100 * v:.1f}%" for n, v in
                                       zip(SIZES, values, strict=True)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "docs" / "stragglers.png")
