"""Hardware catalogue, cluster presets, calibration profiles and communication cost formulas.

Everything here is data plus closed-form costs; it imports nothing from the rest of clustersim
but the shared error and field types.
"""

from .collectives import (
    alltoall_time,
    p2p_time,
    ring_allgather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
)
from .hardware import ClusterSpec, GpuSpec, LinkTier, SpineTier, cluster_presets, gpu_presets
from .profile import Profile, load_profile, profile_for_gpu

__all__ = [
    "ClusterSpec", "GpuSpec", "LinkTier", "SpineTier", "Profile", "alltoall_time",
    "cluster_presets", "gpu_presets", "load_profile", "p2p_time", "profile_for_gpu",
    "ring_allgather_time", "ring_allreduce_time", "ring_reduce_scatter_time",
]
