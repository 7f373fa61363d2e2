"""One configuration in a few words, and the split's columns: what the terminal tables, the
plots and the sweeps' CSV name a configuration by. Kept apart from ``plots.py`` and
``sweep.py`` so that printing a plan loads neither matplotlib nor pandas (issue 12: the
command line imports heavy libraries only where it draws or writes tables)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_label(row: Mapping) -> str:
    """``512 GPUs: tp8+sp pp4 dp16 cp2-p2p ep8 mb1 interleaved×5 z1 selective``: one
    configuration in a few words. tp (``+sp`` with sequence parallelism), pp and dp always; cp
    (with its ``cp_comm``) and ep whenever they are not 1, so splits that differ only there
    (MoE expert parallelism, context parallelism) never read alike, ``ep8-etp1`` where the
    experts fold over the TP ranks (``expert_tp``); ``z3-shard8`` under
    hybrid sharding. Rows of tables written before cp/ep were columns count as 1."""
    schedule = row["schedule"] + (f"×{int(row['virtual_stages'])}"
                                  if int(row["virtual_stages"]) > 1 else "")
    dims = [f"tp{int(row['tp'])}", f"pp{int(row['pp'])}", f"dp{int(row['dp'])}"]
    cp, ep = _int_or_one(row, "cp"), _int_or_one(row, "ep")
    if cp != 1:  # with how its ranks share K and V, where the row says
        dims.append(f"cp{cp}" + (f"-{row['cp_comm']}" if _present(row, "cp_comm") else ""))
    if ep != 1 or _present(row, "expert_tp"):  # experts folded over the TP ranks: -etp1
        dims.append(f"ep{ep}" + (f"-etp{int(row['expert_tp'])}"
                                 if _present(row, "expert_tp") else ""))
    if _present(row, "sequence_parallel") and str(row["sequence_parallel"]) == "True":
        dims[0] += "+sp"
    gpus = f"{int(row['gpus']):,} GPUs: " if _present(row, "gpus") else ""
    zero = f"z{int(row['zero'])}"
    if _present(row, "dp_shard"):  # hybrid sharding: the states over dp_shard ranks a copy
        zero += f"-shard{int(row['dp_shard'])}"
    return (f"{gpus}{' '.join(dims)} mb{int(row['micro_batch'])} {schedule} "
            f"{zero} {row['recompute']}")


def split_columns(s) -> dict[str, Any]:
    """A scenario's split as the sweep table's columns."""
    p, t = s.parallel, s.training
    return {"gpus": s.cluster.gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp,
            "cp_comm": p.cp_comm if p.cp > 1 else None, "ep": p.ep,
            "micro_batch": t.micro_batch, "global_batch": t.global_batch,
            "schedule": p.schedule, "virtual_stages": p.virtual_stages, "zero": p.zero,
            "dp_shard": p.dp_shard if p.hybrid_sharded else None,
            "recompute": p.recompute, "sequence_parallel": p.sequence_parallel,
            # only where the experts fold over the TP ranks: older tables read alike
            **({"expert_tp": p.etp} if p.folded else {})}


def _present(row: Mapping, key: str) -> bool:
    return key in row and not _missing(row[key])


def _missing(value: Any) -> bool:
    """None, NaN (a CSV's empty cell) or pandas' NA, without importing pandas."""
    if value is None:
        return True
    try:
        return bool(value != value)  # only NaN differs from itself
    except TypeError:  # pandas.NA: its comparisons are NA, whose truth is undefined
        return True


def _int_or_one(row: Mapping, key: str) -> int:
    return int(row[key]) if _present(row, key) else 1
