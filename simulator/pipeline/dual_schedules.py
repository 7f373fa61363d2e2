"""DualPipe (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 3.2.1): two pipelines in
opposite directions over the same ranks.

The chunks hold two copies of the model (``stages.chunk_layout(..., "dual")``): chunks
``0..pp-1`` are one copy down the ranks, chunks ``pp..2pp-1`` the other up them, so rank r
holds stage r of the first copy (chunk r) and stage ``pp - 1 - r`` of the second (chunk
``2 pp - 1 - r``): twice the parameters of 1F1B, the two copies' gradients summed every step.
Half of the micro-batches enter at rank 0 and run down, the other half enter at rank
``pp - 1`` and run up, each numbered from 0 within its half (as the repo's per-phase chunk
ids are). Each rank runs DualPipe's order (deepseek-ai/DualPipe dualpipe/dualpipe.py): the
two halves of the ranks mirror each other, rank r and rank ``pp - 1 - r`` running DualPipeV's
order of rank ``min(r, pp - 1 - r)`` on ``pp / 2`` ranks (``v_schedules.dual_rank_order``),
each with the direction whose micro-batches enter nearer it as its first.
"""

from __future__ import annotations

from .list_schedule import list_scheduled_finish, walked_held
from .schedules import PipelineSchedule, Schedule, _check, cached, register_schedule
from .v_schedules import dual_rank_order


@cached
def dualpipe(pp: int, m: int, v: int = 2) -> Schedule:
    """DualPipe's action lists: ``m / 2`` micro-batches each way on ``pp`` ranks (both even,
    ``m >= 2 pp``, as ``DualPipe.step`` asserts), each overlapped forward-backward pair as an
    ``OVERLAP_F_B`` marker, its forward, then its whole backward.

    Rank r (``h = min(r, pp - 1 - r)`` from the nearer end) warms up with ``pp - 2h - 2``
    forwards of the near direction's chunk, ``h + 1`` forwards of both, ``pp/2 - h - 1``
    zero-bubble rounds on the far chunk (I, a deferred W, F); then pairs a forward of one
    chunk with the whole backward of the other, and ends splitting backwards so that the
    deferred weight halves fill the cool-down.
    """
    _check(pp, m, v, allowed_v=(2,))
    why = _even_pp(pp) or _even_and_two_per_rank(pp, m)
    if why:
        raise ValueError(f"DualPipe {why}")
    schedule: Schedule = {}
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r
        near, far = (down, up) if r < pp // 2 else (up, down)  # the repo's phase ^= second half
        schedule[r] = dual_rank_order(pp // 2, min(r, pp - 1 - r), m // 2, near, far)
    return schedule


def _even_pp(pp: int) -> str | None:
    """DualPipe.step's ``assert num_ranks % 2 == 0``: the ranks mirror each other in pairs."""
    if pp % 2:
        return f"needs an even pp, the ranks mirroring each other in pairs (got pp = {pp})"
    return None


def _even_and_two_per_rank(pp: int, m: int) -> str | None:
    """DualPipe.step's asserts ``num_chunks % 2 == 0`` and ``num_chunks >= num_ranks * 2``."""
    if m % 2 or m < 2 * pp:
        return (f"needs an even number of micro-batches per pipeline, at least 2 * pp = "
                f"{2 * pp}, half for each direction (got {m})")
    return None


register_schedule(PipelineSchedule(
    "dualpipe", dualpipe, walked_held("dualpipe"), finish=list_scheduled_finish("dualpipe"),
    chunks_per_rank=True, chunk_counts=(2,), placement="dual",
    microbatch_rule=_even_and_two_per_rank, pp_rule=_even_pp,
    # steady from its smallest count, 2 pp; two micro-batches more (one each way) are one
    # more round of DualPipeV's step 4 on every rank
    steady_from=lambda pp: (2 * pp, 2)))
