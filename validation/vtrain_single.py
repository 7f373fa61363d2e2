"""vTrain's single-node runs as held-out development runs: small models, one node, every split.

``tests/data/vtrain-single-node.yaml`` holds 1,440 iteration times vTrain's authors measured
with Megatron-DeepSpeed on 2-8 A100s of one node (GPT models of hidden size 1,024 and 2,048,
12-24 layers, 1,024-token sequences, every tp x pp x dp of the node, micro-batches 1-8). Where
the development set's runs are large and GPU-bound, these are small enough that the host's time
to issue each layer and the latency of small collectives decide many of them: the one published
check of ``host_layer_s`` and of NVLink's per-step latency that clustersim has.

Each row becomes the published-run record the development set's rules read
(``devset.to_run``), as a vTrain run: the A100's DGX preset, no FlashAttention, no gradient
bucketing, full recomputation as its configs set, 1F1B. Rows of one model, GPU count and global
batch form a job, ranked as the development set's jobs are (``devset.ranking``).
"""

from __future__ import annotations

from pathlib import Path

from clustersim.yamlio import load_yaml_file

from . import devset

SOURCE = "vtrain-single-node"
FILE = "vtrain-single-node.yaml"
COLUMNS = ("gpus", "global_batch", "micro_batch", "hidden", "heads", "layers", "seq_len",
           "tp", "dp", "pp", "iteration_time_ms")


def run_id(row: dict) -> str:
    """A row's name: its model, split and batch, as the development set names vTrain's."""
    return (f"vtrain-single-h{row['hidden']}-l{row['layers']}-g{row['gpus']}-t{row['tp']}"
            f"-d{row['dp']}-p{row['pp']}-mbs{row['micro_batch']}-gbs{row['global_batch']}")


def as_published(row: dict, settings: dict) -> dict:
    """One row as a published-run record of the development set's schema."""
    return {
        "id": run_id(row), "group": SOURCE,
        "hardware": {"gpu": settings["gpu"], "num_gpus": row["gpus"],
                     "gpus_per_node": settings["gpus_per_node"]},
        "model": {"layers": row["layers"], "hidden": row["hidden"], "heads": row["heads"],
                  "kv_heads": None, "ffn_hidden": None, "vocab": None,
                  "seq_len": row["seq_len"]},
        "parallelism": {"tp": row["tp"], "pp": row["pp"], "dp": row["dp"],
                        "schedule": settings["schedule"], "zero_stage": 0,
                        "recompute": settings["recompute"],
                        "micro_batch_size": row["micro_batch"],
                        "global_batch_size": row["global_batch"]},
        "precision": "fp16/bf16 mixed",
        "measured": {"iteration_time_ms": row["iteration_time_ms"]},
    }


def load_runs(path: str | Path) -> list[devset.DevRun]:
    """Every row of the file as a DevRun, in the file's order."""
    data = load_yaml_file(Path(path))
    if tuple(data["columns"]) != COLUMNS:
        raise ValueError(f"{path}: columns {data['columns']}, expected {list(COLUMNS)}")
    runs = []
    for values in data["rows"]:
        row = dict(zip(COLUMNS, values, strict=True))
        run = devset.to_run(as_published(row, data["settings"]))
        if run is None:
            raise ValueError(f"{path}: row {values} is not a scenario")
        runs.append(run)
    return runs
