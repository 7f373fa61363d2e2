"""What the capacity planner tries and how it narrows the field before the engine ranks it.

The space: every valid combination of tp, cp, pp, ep, micro-batch, schedule, virtual stages,
ZeRO stage, recomputation and tensor-parallel overlap (``candidates``). Pipeline depths are the
powers of two and the divisors of the layer count (and of the layers plus two); micro-batches
the powers of two up to a replica's whole share of the batch.

The search's first pass (``SplitSearch``; ``plan_parallel.search_splits`` runs it): each
candidate is built like a scenario file; its closed-form memory must fit, and is checked
first, because memory never shrinks as the micro-batch grows (but under a split backward):
once a split is out of memory at one micro-batch, its larger ones are skipped unchecked
(``plan_memory.py``). Each that fits gets a lower bound of its closed-form step, the tighter
of two (``plan_bound.py``): the weight GEMMs at the peak plus the schedule's unavoidable
bubble, which costs no stage, and every stage running its ``m`` forwards and backwards one
after another. The second pass (``plan_rank.py``) estimates them best bound first until no
bound left beats the ``keep``-th estimate; the engine later ranks those ``keep``. With
``jobs`` > 1 both passes run in processes (``plan_parallel.py``).
Neither shortcut changes which splits reach the engine (``tests/reports/test_plan_search.py``
compares with an exhaustive search); ``docs/planner.md`` says why.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.simulator.costs.stage_costs import StageCosts
from clustersim.simulator.inputs import stack_choices
from clustersim.simulator.inputs.scenario import Scenario, build_cluster
from clustersim.simulator.pipeline.schedules import (
    SCHEDULES,
    PipelineSchedule,
    memory_grows_with_microbatch,
    splits_backward,
)
from clustersim.topologies.hardware import ClusterSpec
from clustersim.topologies.pools import PooledCluster

from .plan_bound import compute_floor_s, end_stages_floor_s, step_floor_s
from .plan_build import ScenarioBuilder, _raw, scenarios_of  # noqa: F401 (_raw: the tests')
from .plan_memory import (  # noqa: F401 (checked_stages, stages_to_check: the tests')
    checked_stages,
    fits_in_memory,
    stages_to_check,
)
from .pool_plan import pipeline_depths

if TYPE_CHECKING:
    from .plan import PlanRequest

VIRTUAL_STAGES = (2, 4, 8)
RECOMPUTE = ("none", "selective", "full")
LONG_SEQUENCE = 16384  # context parallelism is searched from this sequence length on
MIN_CP_TOKENS = 4096  # beyond cp 8, the sequence's tokens a context-parallel rank keeps at least


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def pipeline_depth_candidates(layers: int, gpus: int) -> list[int]:
    """The pipeline depths tried on a cluster without pools, up to the layers and the GPUs:
    the powers of two; every divisor of the layer count (stages of equal depth: 6, 12 and 24
    for GPT-3's 96 layers); and every divisor of the layers plus two, the depths at which the
    embedding and the output layer each count as one more layer (BLOOM-176B's 70 layers on
    12 stages, Megatron-DeepSpeed's partitioning; the zero-bubble authors' advice of
    ``k * pp - 2`` layers). A depth must also divide the GPUs, which ``candidates`` checks
    with tp and cp; an uneven depth spreads the layers as evenly as it can."""
    limit = min(layers, gpus)
    divisors = [d for d in range(1, limit + 1) if layers % d == 0 or (layers + 2) % d == 0]
    return sorted(set(_powers_of_two(limit)) | set(divisors))


def context_parallel_candidates(seq_len: int) -> list[int]:
    """The context-parallel sizes tried: 1, and from ``LONG_SEQUENCE`` tokens on 2, 4 and 8, then
    each further power of two that leaves a rank at least ``MIN_CP_TOKENS`` of the sequence:
    Llama 3 405B ran 131,072 tokens on cp 16 (8K a rank), NeMo's long-sequence runs 1M tokens on
    cp 32 (docs/planner.md)."""
    if seq_len < LONG_SEQUENCE:
        return [1]
    more = [c for c in _powers_of_two(seq_len // MIN_CP_TOKENS) if c > 8]
    return [1, 2, 4, 8, *more]


def micro_batch_candidates(global_batch: int, replicas: int) -> list[int]:
    """The micro-batches tried for ``replicas`` data-parallel replicas: every power of two
    from 1 up to a replica's whole share of the batch that divides it evenly. The large ones
    matter without a pipeline (fewer, larger GEMMs); memory prunes them (``plan``)."""
    share = global_batch // replicas if global_batch % replicas == 0 else 0
    return [mb for mb in _powers_of_two(share) if share % mb == 0]


def candidates(req: PlanRequest, base: Scenario,
               cluster: ClusterSpec | PooledCluster | None = None) -> Iterator[dict]:
    """Raw scenarios of every split worth trying (validity is checked by the caller); a field
    pinned in ``req.fixed`` takes only its pinned value. On a cluster of pools, tp fits a node
    of every pool and the pipeline depths are those whose stages are whole in each pool.
    Each split comes with its micro-batches in increasing order, so that ``plan`` can skip the
    larger ones once a smaller one is out of memory."""
    m, c = base.model, cluster or base.cluster
    gpus = req.cluster["gpus"]

    tps = _pick(req, "parallel.tp", [t for t in _powers_of_two(min(c.gpus_per_node, m.heads))
                                     if m.heads % t == 0])
    cps = _pick(req, "parallel.cp", context_parallel_candidates(m.seq_len))
    pps = _pick(req, "parallel.pp",
                pipeline_depths(m.layers, gpus, c) if isinstance(c, PooledCluster)
                else pipeline_depth_candidates(m.layers, gpus))
    eps = _pick(req, "parallel.ep",
                [e for e in _powers_of_two(m.experts) if m.experts % e == 0]
                if m.experts > 1 else [1])
    for tp, cp, pp, ep in itertools.product(tps, cps, pps, eps):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        if dp != req.fixed.get("parallel.dp", dp):
            continue
        for folding in _expert_folding(req, base, c, tp, cp * dp, ep):
            yield from _splits(req, base, tp, cp, pp, dp, ep, folding)


def _expert_folding(req: PlanRequest, base: Scenario, c, tp: int, replicas: int,
                    ep: int) -> list[dict]:
    """The routed experts' tensor parallelism worth trying: as the dense layers' (``{}``),
    where ep divides the ``replicas`` (dp*cp), and, for an MoE model with tp > 1 and ep > 1
    off a cluster of pools, folded (``expert_tp`` 1: whole experts, EP over tp*dp*cp ranks),
    where ep divides those. Whole experts without expert parallelism, every rank holding all
    of them, are left to ``--fix parallel.expert_tp=1``."""
    choices = [{}] if replicas % ep == 0 else []
    pinned = req.fixed.get("parallel.expert_tp")
    if (base.model.experts > 1 and tp > 1 and not isinstance(c, PooledCluster)
            and (ep > 1 or pinned == 1) and (tp * replicas) % ep == 0):
        choices.append({"expert_tp": 1})
    if "parallel.expert_tp" in req.fixed:
        choices = [f for f in choices if f.get("expert_tp", tp) == (pinned or tp)]
    return choices


def _splits(req: PlanRequest, base: Scenario, tp: int, cp: int, pp: int, dp: int, ep: int,
            folding: dict) -> Iterator[dict]:
    """Every micro-batch, schedule and context exchange of one shape (hybrid sharding, which
    folded experts do not take, only where they are not folded)."""
    exchanges = [{}] if cp == 1 else [{"cp_comm": x} for x in _pick(
        req, "parallel.cp_comm", list(stack_choices.choices(base.training.framework).cp_comms))]
    shard = None if folding else _node_shard(base, tp, cp, dp)
    for mb in _pick(req, "training.micro_batch", micro_batch_candidates(req.global_batch, dp)):
        if req.global_batch % (dp * mb):
            continue
        for variant, exchange in itertools.product(_variants(req, base, tp, pp, dp * cp, shard),
                                                   exchanges):
            yield {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, **folding, **exchange,
                   **variant, "micro_batch": mb}


def _pick(req: PlanRequest, path: str, values: list) -> list:
    """``values``, or the one ``req`` pins ``path`` to."""
    return [req.fixed[path]] if path in req.fixed else values


def _node_shard(base: Scenario, tp: int, cp: int, dp: int) -> int | None:
    """The data-parallel ranks of one node (``dp_shard`` for one sharded copy a node, HSDP),
    where the stack searches hybrid sharding and the replicas span nodes; else None."""
    per_node = getattr(base.cluster, "gpus_per_node", None)  # none on a cluster of pools
    if not (per_node and stack_choices.choices(base.training.framework).hybrid_sharding):
        return None
    shard = per_node // (tp * cp) if per_node % (tp * cp) == 0 else 0
    return shard if 1 < shard < dp and dp % shard == 0 else None


def _chunk_counts(sched: PipelineSchedule) -> tuple[int, ...]:
    """The chunks per rank the planner tries with a schedule."""
    return sched.chunk_counts or (VIRTUAL_STAGES if sched.chunks_per_rank else (1,))


def _variants(req: PlanRequest, base: Scenario, tp: int, pp: int, replicas: int,
              node_shard: int | None = None) -> Iterator[dict]:
    """Schedule, ZeRO stage (and hybrid sharding over ``node_shard`` ranks, where given),
    recomputation and the tensor-parallel switches of one shape, as far as the training stack
    runs them (``stack_choices.py``)."""
    fixed, stack = req.fixed, base.training.framework
    layers = base.model.layers
    sp = fixed.get("parallel.sequence_parallel", tp > 1)
    if "parallel.schedule" in fixed:
        vs = [fixed.get("parallel.virtual_stages", v)
              for v in _chunk_counts(SCHEDULES[fixed["parallel.schedule"]])]
        schedules = [(fixed["parallel.schedule"], v) for v in dict.fromkeys(vs)]
    elif "parallel.virtual_stages" in fixed:
        v = fixed["parallel.virtual_stages"]
        schedules = [("interleaved", v)] if v > 1 else [("1f1b", 1)]
    elif pp == 1:  # one stage: every schedule runs the same work
        schedules = [("1f1b", 1)]
    else:  # the registered schedules the stack runs, each chunk count that fits the layers
        schedules = [(name, v) for name, sched in SCHEDULES.items()
                     if sched.searched and stack_choices.schedule_runs(stack, name, sp)
                     for v in _chunk_counts(sched) if pp * v <= layers]
    stages = stack_choices.zero_stages(stack, pp > 1, base.training.precision)
    zeros = [fixed["parallel.zero"]] if "parallel.zero" in fixed else (
        list(stages) if replicas > 1 else [stages[0]])  # one replica: nothing to shard
    shardings = [(z, None) for z in zeros]
    if node_shard and "parallel.dp_shard" not in fixed:
        shardings += [(z, node_shard) for z in zeros if z >= 1]
    # With fused attention, selective recomputation of the attention core alone has nothing
    # left to drop: it is "none" (torchtitan's op-level selective is another matter).
    attention_only = (stack_choices.attention_only(fixed["parallel.recompute_modules"])
                      if "parallel.recompute_modules" in fixed
                      else stack_choices.selective_reruns_attention_only(stack))
    recomputes = [fixed["parallel.recompute"]] if "parallel.recompute" in fixed else [
        r for r in RECOMPUTE
        if not (r == "selective" and base.training.flash_attention and attention_only)]
    # Overlapping TP collectives with GEMMs needs sequence parallelism (Megatron-Core) and
    # Transformer Engine's userbuffers, which only Megatron-LM runs.
    overlaps = [fixed["parallel.tp_comm_overlap"]] if "parallel.tp_comm_overlap" in fixed else (
        [False, True] if tp > 1 and sp and stack_choices.choices(stack).tp_comm_overlap
        else [False])
    for (schedule, v), (zero, shard), recompute, overlap in itertools.product(
            schedules, shardings, recomputes, overlaps):
        if overlap and tp > 1 and splits_backward(schedule):
            # Transformer Engine refuses the pair (simulator/inputs/rules.py, _userbuffers)
            continue
        hybrid = {"dp_shard": shard} if shard else {}
        yield {"schedule": schedule, "virtual_stages": v, "zero": zero, **hybrid,
               "recompute": recompute, "sequence_parallel": sp, "tp_comm_overlap": overlap}


def shape_groups(splits: list[dict]) -> list[list[dict]]:
    """The splits in runs of one shape (tp, cp, pp, dp, ep), in their order: every
    micro-batch of a split lies in one run, so that the memory shortcut works within it."""
    return [list(run) for _, run in itertools.groupby(splits, key=lambda d: tuple(
        d.get(k) for k in ("tp", "cp", "pp", "dp", "ep", "expert_tp")))]


def search_group(req: PlanRequest, splits: list[dict], group: int = 0,
                 progress: Callable[[int, int], None] | None = None,
                 prune: bool = True) -> SplitSearch:
    """The first pass over ``splits`` (the ``group``-th run of the request's) in this
    process (``SplitSearch.run``); ``plan_rank.py`` then estimates the bounded best first."""
    search = SplitSearch(req, prune)
    search.run(splits, group, progress)
    return search


class SplitSearch:
    """The first pass of a search: how many scenarios were valid and fit, per split the
    smallest micro-batch found out of memory, and each that fits with a lower bound of its
    closed-form step (``pending``), in the order considered.

    A scenario's place in that order (``seq``: its run of splits, its split in the run, its
    placement on a cluster of pools) ranks equal estimates, as a stable sort of the splits in
    their order would, whatever order they are estimated in (``plan_rank.py``: best bound
    first, and over several processes)."""

    def __init__(self, req: PlanRequest, prune: bool = True) -> None:
        self.req, self.prune = req, prune
        self.valid = self.fit = 0
        self.first_error: ScenarioError | None = None
        # Fit: (end-stage bound, seq, split, the scenario, or None once sent between processes)
        self.pending: list[tuple[float, tuple, dict, Scenario | None]] = []
        self.fitting: list[tuple[float, Scenario]] = []  # estimated (plan_rank.py)
        self.out_of_memory: dict[tuple, int] = {}  # split but its micro-batch -> smallest OOM
        self.skipped_memory = 0  # not checked: a smaller micro-batch was out of memory
        self.skipped_slow = 0  # fit, not estimated: slower than the ``keep`` fastest
        self.skipped_floor = 0  # of those, by the step floor (plan_bound.py)
        self.floor_tighter: set[tuple] = set()  # the pending whose step floor is the bound
        self.compute_floor: float | None = None  # plan_bound.compute_floor_s, once
        # One layer's costs, shared by the splits alike but for their schedule (CostModel)
        self.layer_costs: dict = {}
        self.activations: dict = {}  # and its stages' activations, by the ZeRO stages (memory)
        self.cluster, self.builder = build_cluster(req.cluster), ScenarioBuilder()

    @classmethod
    def merged(cls, req: PlanRequest, prune: bool, parts: list[SplitSearch]) -> SplitSearch:
        """The first passes of consecutive runs of splits as one, in their order."""
        whole = cls(req, prune)
        for part in parts:
            whole.valid += part.valid
            whole.fit += part.fit
            whole.first_error = whole.first_error or part.first_error
            whole.pending += part.pending
            whole.floor_tighter |= part.floor_tighter
            whole.out_of_memory.update(part.out_of_memory)
            whole.skipped_memory += part.skipped_memory
        return whole

    def run(self, splits: list[dict], group: int,
            progress: Callable[[int, int], None] | None = None) -> None:
        """Consider ``splits``, the ``group``-th run of the request's, one after another:
        each counted, checked for memory and, where it fits, bounded."""
        for j, split in enumerate(splits):
            if progress:
                progress(j + 1, len(splits))
            for sub, s in enumerate(scenarios_of(self.req, split, self.cluster, self.builder)):
                self.consider(split, s, (group, j, sub))

    def consider(self, split: dict, s: Scenario | ScenarioError, seq: tuple) -> None:
        """Count ``s``; bound its step if it fits."""
        if isinstance(s, ScenarioError):
            self.first_error = self.first_error or s
            return  # e.g. kv heads against tp, or interleaving a too-short pipeline
        p = s.parallel
        if not stack_choices.microbatches_run(s.training.framework, p.schedule, p.pp,
                                              s.microbatches):
            return  # a count the stack refuses (torch's interleaved rounds)
        self.valid += 1
        if self._fits(split, s):
            self.fit += 1
            self._bound(split, s, seq)

    def _bound(self, split: dict, s: Scenario, seq: tuple) -> None:
        """Put ``s`` in ``pending`` with the tighter of two lower bounds of its closed-form
        step: the weight GEMMs at the peak stretched by the schedule's unavoidable bubble
        (``plan_bound.step_floor_s``, which costs no stage and wins on deep pipelines with
        few micro-batches), and every stage running its ``m`` forwards and backwards one
        after another (``plan_bound.end_stages_floor_s``: the end stages' compute, the
        embedding and the head making them the heaviest; not their communication, ZeRO-3
        or data-parallel traffic and optimizer, which only a split it does not skip needs)."""
        if self.compute_floor is None:  # the request's alone: the same for every split
            self.compute_floor = compute_floor_s(s)
        floor = step_floor_s(s, self.compute_floor)
        end = end_stages_floor_s(s, StageCosts(s, self.req.profile, self.layer_costs))
        if floor > end:
            self.floor_tighter.add(seq)
        self.pending.append((max(floor, end), seq, split, s))

    def without_scenarios(self) -> SplitSearch:
        """This pass, light to send between processes: its pending splits without their
        scenarios (rebuilt where estimated), without its caches."""
        self.pending = [(bound, seq, split, None) for bound, seq, split, _ in self.pending]
        self.layer_costs, self.activations = {}, {}
        self.builder = ScenarioBuilder()
        return self

    def _fits(self, split: dict, s: Scenario) -> bool:
        """Memory grows with the micro-batch (the activations held scale with it; the
        micro-batches in flight shrink no faster than it grows), so a split out of memory at
        one micro-batch is at every larger one: those are not checked again. Not so where
        the schedule says otherwise (``memory_grows_with_microbatch``: a split backward, an
        interleaved count off the pp grid), so a larger micro-batch may need less."""
        key, mb = _split_key(split, s), split["micro_batch"]
        if self.prune and self.out_of_memory.get(key, mb + 1) <= mb:
            self.skipped_memory += 1
            return False
        if fits_in_memory(s, self.req.memory_reserve, self.activations):
            return True
        if memory_grows_with_microbatch(s.parallel.schedule, s.parallel.pp, s.microbatches):
            self.out_of_memory[key] = min(mb, self.out_of_memory.get(key, mb))
        return False


def _split_key(split: dict, s: Scenario) -> tuple:
    """Everything of a split but its micro-batch, and the stages' pools and layers it got."""
    p = s.parallel
    pools = tuple(p.stage_pools) if p.stage_pools is not None else None
    layers = tuple(p.stage_layers) if p.stage_layers is not None else None
    return (*sorted((k, v) for k, v in split.items() if k != "micro_batch"), pools, layers)
