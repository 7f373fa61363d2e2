"""How the context-parallel ranks share keys and values, four ways, on three long-context jobs
(docs/modelling.md, "context parallelism"; ``parallel.cp_comm``).

    python3 examples/context-parallel-exchanges.py

``p2p`` passes each rank's K/V block round a ring behind the attention it meets; ``allgather``
gathers the whole sequence's K and V before the attention (Llama 3's, torchtitan's), exposed;
``a2a`` (Ulysses) trades the sequence split for a head split with two all-to-alls each way,
exposed, and needs each rank's heads, K/V heads included, to divide over cp; ``a2a+p2p``
(Megatron-Core's hierarchical CP) runs the all-to-alls inside a node and the ring across nodes,
and needs the heads to divide over a node's CP ranks only. Prints each job's
step time, the context-parallel time left exposed, the bytes a GPU sends for it per step and the
peak memory, or the error where the split cannot run. A few seconds, closed forms only.
"""

from __future__ import annotations

import clustersim
from clustersim.errors import ScenarioError

JOBS = {  # name: (model, tokens a sequence, GPUs, cp)
    "Llama 2 7B (32 K/V heads), 32K tokens, cp 8 in one node": ("llama2-7b", 32_768, 8, 8),
    "Llama 2 7B (32 K/V heads), 128K tokens, cp 16 over two nodes": ("llama2-7b", 131_072, 16, 16),
    "Llama 3 8B (8 K/V heads), 128K tokens, cp 16 over two nodes": ("llama3-8b", 131_072, 16, 16),
}
EXCHANGES = ("p2p", "allgather", "a2a", "a2a+p2p")


def scenario(model: str, tokens: int, gpus: int, cp: int, exchange: str) -> dict:
    return {"model": {"preset": model, "seq_len": tokens},
            "cluster": {"preset": "dgx-h100", "gpus": gpus},
            "training": {"global_batch": 8, "micro_batch": 1, "precision": "bf16"},
            "parallel": {"cp": cp, "cp_comm": exchange, "zero": 1, "recompute": "full"}}


def main() -> None:
    for job, shape in JOBS.items():
        print(job)
        print(f"  {'cp_comm':10s} {'step s':>8s} {'cp exposed s':>13s} {'cp GB sent':>11s} "
              f"{'peak GiB':>9s}")
        for exchange in EXCHANGES:
            try:
                r = clustersim.simulate(scenario(*shape, exchange)).to_dict()
            except ScenarioError as err:
                print(f"  {exchange:10s} error: {err}")
                continue
            exposed = r["breakdown_per_stage"][0]["exposed_comm_by_kind"]["cp"]
            print(f"  {exchange:10s} {r['step_time_s']:8.2f} {exposed:13.2f} "
                  f"{r['traffic_bytes']['cp'] / 1e9:11.1f} "
                  f"{r['memory']['peak_bytes'] / 2**30:9.1f}")


if __name__ == "__main__":
    main()
