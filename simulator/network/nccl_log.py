"""An nccl-tests run on a real cluster, read back: its bus bandwidths by size, and the fraction
of a link tier's line rate that makes clustersim's collective reproduce them.

``all_reduce_perf`` and its siblings print one row per size under a commented header whose
columns name the out-of-place ``busbw`` first (nccl-tests' README, "Performance"; rows before
2.x had no ``root`` column, so the header says where it is). What that bandwidth measured is
the slowest tier the collective crosses: NVLink within one node, the NICs across nodes. The
fraction found goes into the cluster file (``cluster.<tier>.efficiency``) in place of the GPU
profile's, which was measured on NVIDIA's own fabrics.
"""

from __future__ import annotations

from clustersim.errors import ScenarioError
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.profile import Profile

from .bus_bandwidth import bus_bandwidth

DEFAULT_BUSBW_COLUMN = 7  # size count type redop root time algbw busbw
LOWEST = 1e-3  # no fabric reaches less of its line rate: a lower fit is a wrong line rate


def measured_busbw(text: str, source: str = "--measured") -> dict[int, float]:
    """Out-of-place bus bandwidth (GB/s) by size (bytes) of an nccl-tests output; an error
    naming ``source`` where it holds no row."""
    column, rows = DEFAULT_BUSBW_COLUMN, {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            names = line.lstrip("# \t").split()
            if "size" in names and "busbw" in names:
                column = names.index("busbw")
            continue
        if words[0].isdigit() and int(words[0]) > 0 and len(words) > column:
            try:
                rows[int(words[0])] = float(words[column])
            except ValueError:
                continue  # not a result row (e.g. a size printed in a warning)
    if not rows:
        raise ScenarioError(source, "no nccl-tests result rows (size ... busbw) found")
    return rows


def crossed_tier(cluster: ClusterSpec, gpus: int) -> str:
    """The tier whose rate bounds a collective over the first ``gpus`` GPUs."""
    return "inter_node" if gpus > cluster.gpus_per_node else "intra_node"


def fitted_efficiency(cluster: ClusterSpec, profile: Profile, op: str, gpus: int,
                      nbytes: int, busbw: float, fidelity: str = "representative"
                      ) -> float | None:
    """The fraction of the crossed tier's line rate at which ``op`` over ``gpus`` GPUs reaches
    ``busbw`` (GB/s) at ``nbytes``, to 0.1%; None where even the whole line rate falls short
    (the cluster's line rate is lower than the fabric's) or the least fraction overshoots."""
    tier = crossed_tier(cluster, gpus)

    def predicted(efficiency: float) -> float:
        link = getattr(cluster, tier).model_copy(update={"efficiency": efficiency})
        return bus_bandwidth(cluster.model_copy(update={tier: link}), profile, op, gpus,
                             nbytes, fidelity) / 1e9

    low, high = LOWEST, 1.0
    if predicted(high) < busbw or predicted(low) > busbw:
        return None
    while high - low > 1e-3 * high:  # the busbw grows with the fraction: bisect
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < busbw else (low, middle)
    return (low + high) / 2
