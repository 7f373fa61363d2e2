"""InfiniBand against RoCE (400 Gb/s Ethernet) on the same switches, in full fidelity (README,
"Switches: what-ifs only full fidelity answers").

    python examples/roce-vs-infiniband.py [OUT.png]

Both fabrics run 400 Gb/s per GPU through fat-tree leaves with eight spines each. What
differs is how a flow between leaves finds its spine: InfiniBand's adaptive routing spreads
it over all of them (``routing: adaptive``), an Ethernet/RoCE switch pins it to one by a
static ECMP hash of its endpoints (``routing: ecmp``; three hash seeds, as three ways the
same job can land). Two jobs: examples/fabric-llama3-70b.yaml (dense, 1,024 H100, gradient
rings and pipeline sends cross leaves) and examples/mixtral-8x7b-h100.yaml on 64 H100 with
one node per leaf switch (token all-to-alls cross leaves too). Prints step times, the
representative estimate beside them, and plots them; writes docs/roce-vs-infiniband.png by
default. About a minute on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import clustersim  # noqa: E402

HERE = Path(__file__).parent
JOBS = {  # name: (scenario, leaf NIC ports)
    "Llama 3 70B, 1,024 H100": (HERE / "fabric-llama3-70b.yaml", 32),
    "Mixtral 8x7B, 64 H100": (HERE / "mixtral-8x7b-h100.yaml", 8),
}
RATIOS = (1.0, 2.0, 4.0)
SEEDS = (0, 1, 2)


def step(scenario: Path, fidelity: str = "full", **net) -> float:
    fabric = {"bandwidth": 50, "latency": 5.0e-6, "topology": "fat-tree", "spines": 8, **net}
    return clustersim.simulate(scenario, fidelity=fidelity,
                               cluster__inter_node=fabric).step_time_s


def measure() -> dict[str, dict[float, dict[str, object]]]:
    """Per job and oversubscription: InfiniBand, RoCE per seed, and representative."""
    table: dict[str, dict[float, dict[str, object]]] = {}
    for job, (scenario, ports) in JOBS.items():
        table[job] = {}
        for r in RATIOS:
            net = {"leaf_ports": ports, "oversubscription": r}
            table[job][r] = {
                "infiniband": step(scenario, routing="adaptive", **net),
                "roce": [step(scenario, routing="ecmp", ecmp_seed=s, **net) for s in SEEDS],
                "representative": step(scenario, "representative", **net)}
    return table


def report(table) -> None:
    for job, rows in table.items():
        print(f"{job}: step time (s), full fidelity")
        print("  leaves   InfiniBand (adaptive)   RoCE (ECMP seeds 0/1/2)   representative")
        for r, row in rows.items():
            roce = " / ".join(f"{t:.3f}" for t in row["roce"])
            print(f"  {r:.0f}:1      {row['infiniband']:.3f}                  {roce}"
                  f"     {row['representative']:.3f}")


def plot(table, out: Path) -> None:
    fig, axes = plt.subplots(1, len(table), figsize=(10, 3.6))
    for ax, (job, rows) in zip(axes, table.items(), strict=True):
        x = range(len(RATIOS))
        ax.bar([i - 0.2 for i in x], [rows[r]["infiniband"] for r in RATIOS], 0.4,
               label="InfiniBand, adaptive routing")
        roce = [rows[r]["roce"] for r in RATIOS]
        mid = [sum(t) / len(t) for t in roce]
        ax.bar([i + 0.2 for i in x], mid, 0.4, label="RoCE, static ECMP (seeds 0-2)",
               yerr=[[m - min(t) for m, t in zip(mid, roce, strict=True)],
                     [max(t) - m for m, t in zip(mid, roce, strict=True)]], capsize=4)
        ax.set_xticks(list(x), [f"{r:.0f}:1" for r in RATIOS])
        ax.set_xlabel("leaf oversubscription")
        ax.set_ylabel("step time (s)")
        ax.set_title(job, fontsize=10)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Same switches, 400 Gb/s per GPU: how flows find a spine", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    results = measure()
    report(results)
    plot(results, Path(sys.argv[1]) if len(sys.argv) > 1
         else HERE.parent / "docs" / "roce-vs-infiniband.png")
