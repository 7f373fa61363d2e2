"""GEMM shapes and what one costs on a GPU: roofline, tile and wave quantisation, launch overhead.

A GEMM ``Y[m, n] = X[m, k] W[k, n]`` runs as ``ceil(m/Tm) * ceil(n/Tn)`` output tiles spread over
the GPU's SMs in waves; the last wave may leave SMs idle and edge tiles compute padding (NVIDIA,
"Matrix Multiplication Background User's Guide", sections "Tile quantization" and "Wave
quantization", docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication).
Its time is the larger of compute at ``peak * ceiling * quantisation`` and its operands and result
through HBM (the roofline on arithmetic intensity, same guide, "Math and memory bounds"), plus
the profile's per-kernel overhead. Calculon (Isaev et al., SC'23) costs kernels the same way: a
size-dependent efficiency on the FLOPs and on the bytes, the slower of the two.

Backward runs two GEMMs per forward one, with other shapes: the data gradient
``dX[m, k] = dY[m, n] W^T`` and the weight gradient ``dW[k, n] = X^T dY`` (reduction over the
``m`` tokens), which is why they are costed apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Gemm:
    """``batch`` independent products of an ``m x k`` by a ``k x n`` matrix."""

    m: float
    n: float
    k: float
    batch: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def operand_bytes(self, width: int) -> float:
        """Both inputs read and the output written once (the roofline's lower bound)."""
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch * width

    def dgrad(self) -> Gemm:
        """``dX = dY W^T``: ``m x n`` by ``n x k``."""
        return Gemm(self.m, self.k, self.n, self.batch)

    def wgrad(self) -> Gemm:
        """``dW = X^T dY``: ``k x m`` by ``m x n``."""
        return Gemm(self.k, self.n, self.m, self.batch)


def quantisation(g: Gemm, sms: int | None, tiles: list[tuple[int, int]]) -> float:
    """Useful fraction of the tile-waves a GEMM occupies, for the best of the candidate tiles
    (cuBLAS's heuristics pick among several); 1.0 where the SM count is unknown."""
    if not sms or not tiles:
        return 1.0
    return _best_fraction(g, sms, tuple(map(tuple, tiles)))  # hashable, whatever was given


@lru_cache(maxsize=4096)
def _best_fraction(g: Gemm, sms: int, tiles: tuple[tuple[int, int], ...]) -> float:
    """``quantisation`` worked out, once per shape (NOTE: remembered: a plan costs the same
    few hundred GEMM shapes for thousands of splits)."""
    return max(_tile_fraction(g, sms, tm, tn) for tm, tn in tiles)


def _tile_fraction(g: Gemm, sms: int, tm: int, tn: int) -> float:
    count = math.ceil(g.m / tm) * math.ceil(g.n / tn) * g.batch
    waves = math.ceil(count / sms)
    return (g.m * g.n * g.batch) / (waves * sms * tm * tn)
