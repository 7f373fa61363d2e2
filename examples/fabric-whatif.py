"""Scale-out fabric what-ifs in full fidelity (README, "Switches: what-ifs only full fidelity
answers").

    python examples/fabric-whatif.py [OUT.png]

examples/fabric-llama3-70b.yaml (Llama 3 70B, 1,024 H100) under rail-optimized, fat-tree and
rail-only pods, fat-tree leaves oversubscribed 1:1 to 8:1, with eight spines under static ECMP
(three hash seeds) and with one aggregated uplink (no hashing); then one GPU's NIC at half
its rated speed, in full fidelity and in representative. Prints the step times and plots the
oversubscription sweep; writes docs/fabric-whatif.png by default. About two minutes on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import clustersim  # noqa: E402

HERE = Path(__file__).parent
SCENARIO = HERE / "fabric-llama3-70b.yaml"
RATIOS = (1.0, 2.0, 4.0, 8.0)
SEEDS = (0, 1, 2)


def step(fidelity: str = "full", faults: list | None = None, **net) -> float:
    fabric = {"bandwidth": 50, "latency": 5.0e-6, **net}
    return clustersim.simulate(SCENARIO, fidelity=fidelity, cluster__inter_node=fabric,
                               cluster__faults=faults or []).step_time_s


def main(out: Path) -> None:
    rail = step(topology="rail-optimized")
    rail_only = step(topology="rail-only")
    ecmp = {r: [step(topology="fat-tree", oversubscription=r, ecmp_seed=s) for s in SEEDS]
            for r in RATIOS}
    one_uplink = {r: step(topology="fat-tree", oversubscription=r, spines=1) for r in RATIOS}
    print(f"rail-optimized 1:1: {rail:.3f} s    rail-only: {rail_only:.3f} s")
    print("fat-tree   8 spines, ECMP seeds 0/1/2     one aggregated uplink")
    for r in RATIOS:
        seeds = " / ".join(f"{t:.3f}" for t in ecmp[r])
        print(f"  {r:.0f}:1     {seeds} s        {one_uplink[r]:.3f} s")
    slow_nic = [{"gpu": 300, "port": "nic", "bandwidth_factor": 0.5}]
    print(f"GPU 300's NIC at half speed (rail-optimized): full "
          f"{step(topology='rail-optimized', faults=slow_nic):.3f} s, representative "
          f"{step('representative', topology='rail-optimized', faults=slow_nic):.3f} s "
          f"(healthy: {step('representative', topology='rail-optimized'):.3f} s)")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(RATIOS))
    ax.plot(x, [one_uplink[r] for r in RATIOS], "o-", label="fat-tree, one aggregated uplink")
    for i, seed in enumerate(SEEDS):
        ax.plot(x, [ecmp[r][i] for r in RATIOS], "s--", alpha=0.7,
                label=f"fat-tree, 8 spines, ECMP seed {seed}")
    ax.axhline(rail, color="grey", lw=1, label="rail-optimized 1:1")
    ax.set_xticks(list(x), [f"{r:.0f}:1" for r in RATIOS])
    ax.set_xlabel("leaf oversubscription")
    ax.set_ylabel("step time (s)")
    ax.set_title("Llama 3 70B, 1,024 H100, full fidelity: the fabric under the same split")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "docs" / "fabric-whatif.png")
