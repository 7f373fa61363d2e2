"""A copy kernel that holds a chosen number of SMs for as long as asked: the stand-in for a
collective's thread blocks in ``layer_kernels``' overlap sweep (NCCL runs one block per
channel, each on its own SM)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # bf16 elements a block moves per step: 16 bytes a thread at 16 warps


@triton.jit(do_not_specialize=["n", "rounds"])  # one build for every round count
def _copy_rounds(src, dst, n, rounds, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for _ in tl.range(0, rounds):
        for start in tl.range(pid * BLOCK, n, programs * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


class SmCopy:
    """Copies ``src`` into a buffer of its size ``rounds`` times over with ``sms`` blocks."""

    def __init__(self, src: torch.Tensor) -> None:
        self.src, self.dst = src, torch.empty_like(src)
        self.bytes_per_round = 2 * src.numel() * src.element_size()  # read plus written
        self._seconds: dict[int, float] = {}

    def run(self, sms: int, rounds: int) -> None:
        _copy_rounds[(sms,)](self.src, self.dst, self.src.numel(), rounds, BLOCK=BLOCK,
                             num_warps=16)

    def seconds_per_round(self, sms: int) -> float:
        """One round's time with ``sms`` blocks and the GPU otherwise idle (measured once)."""
        if sms not in self._seconds:
            self.run(sms, 1)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.run(sms, 3)
            end.record()
            end.synchronize()
            self._seconds[sms] = start.elapsed_time(end) / 3e3
        return self._seconds[sms]
