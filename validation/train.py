"""Train the small GPT for a few steps with a real DP x TP x CP x PP split and ZeRO, on one rank.

Ranks are numbered as the simulator places them: TP innermost, then CP, DP, PP. Data is drawn
from the seed, step by step, identically on every rank; each DP replica takes its slice of the
global batch and runs it as ``microbatches`` micro-batches, each CP rank its part of every
sequence. Gradients average over the DP x CP ranks, which hold the same weights (Megatron-LM's
data-parallel group with context parallelism). The same code with every size 1 is the
single-process reference the split runs must match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from clustersim.simulator.pipeline.schedules import (
    build_schedule,
    schedule_named,
    with_communication,
)
from clustersim.simulator.pipeline.stages import chunk_stages, even_split

from .context import ContextParallel, local_positions
from .measure import ActivationMeter, PhaseClock, state_bytes, step_statistics
from .model import GPTShape, build_layers, lm_loss
from .moe import ExpertParallel
from .pipeline import PipelineRank, run_actions
from .tensor_parallel import TensorParallel, sync_sequence_parallel_grads


@dataclass(frozen=True)
class RunConfig:
    """One real training run: the model, the split, the batch and the optimizer."""

    shape: GPTShape
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1  # experts spread over groups of ep consecutive DP ranks (MoE shapes)
    cp: int = 1  # each sequence split over cp ranks (context.py)
    cp_comm: str = "p2p"  # how they share K and V: p2p, allgather or a2a
    expert_tp: int | None = None  # None: tp (experts split like the MLP); 1: whole (folded)
    microbatches: int = 4  # per replica per step
    micro_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    steps: int = 3
    lr: float = 1e-3
    seed: int = 1234
    device: str = "cpu"  # "cuda": this rank's GPU (NCCL runs)
    # "bf16": PyTorch autocast (bf16 GEMMs and attention, fp32 weights, gradients and AdamW
    # state), the mixed precision FSDP and Hugging Face runs train in; "fp32": everything fp32.
    precision: str = "fp32"

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights (DP x CP): their gradients average."""
        return self.dp * self.cp

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatches * self.micro_batch


@dataclass(frozen=True)
class Groups:
    """This rank's coordinates and process groups."""

    tp: TensorParallel
    dp_group: dist.ProcessGroup | None  # the DP x CP ranks holding this rank's weights
    dp_rank: int
    pp_rank: int
    rank_of_stage: list[int]
    ep: ExpertParallel = ExpertParallel()
    cp: ContextParallel = ContextParallel()


def make_groups(cfg: RunConfig, rank: int, sequence_parallel: bool) -> Groups:
    """Every rank creates every group in the same order (torch.distributed requires it)."""
    tp_rank, cp_rank = rank % cfg.tp, rank // cfg.tp % cfg.cp
    dp_rank, pp_rank = rank // (cfg.tp * cfg.cp) % cfg.dp, rank // (cfg.tp * cfg.cp * cfg.dp)

    def at(t: int, c: int, d: int, p: int) -> int:
        return t + cfg.tp * (c + cfg.cp * (d + cfg.dp * p))
    tp_group = cp_group = dp_group = None
    cp_ranks = [at(tp_rank, c, dp_rank, pp_rank) for c in range(cfg.cp)]
    for p in range(cfg.pp):
        for d in range(cfg.dp):
            for c in range(cfg.cp):
                group = dist.new_group([at(t, c, d, p) for t in range(cfg.tp)])
                if (c, d, p) == (cp_rank, dp_rank, pp_rank):
                    tp_group = group
            for t in range(cfg.tp):
                group = dist.new_group([at(t, c, d, p) for c in range(cfg.cp)])
                if (t, d, p) == (tp_rank, dp_rank, pp_rank):
                    cp_group = group
        for t in range(cfg.tp):
            group = dist.new_group([at(t, c, d, p) for d in range(cfg.dp) for c in range(cfg.cp)])
            if (t, p) == (tp_rank, pp_rank):
                dp_group = group
    tp = TensorParallel(tp_group, cfg.tp, tp_rank, sequence_parallel)
    cp = ContextParallel(cp_group, cfg.cp, cp_rank, cfg.cp_comm, tuple(cp_ranks))
    return Groups(tp, dp_group, dp_rank, pp_rank,
                  [at(tp_rank, cp_rank, dp_rank, p) for p in range(cfg.pp)],
                  _expert_groups(cfg, tp_rank, dp_rank, pp_rank,
                                 lambda t, d, p: at(t, cp_rank, d, p)), cp)


def _expert_groups(cfg: RunConfig, tp_rank: int, dp_rank: int, pp_rank: int,
                   at) -> ExpertParallel:
    """Expert parallelism over consecutive ranks of a lane, as the simulator places it
    (``placement.expert_strides``): a TP rank's DP ranks, or, folded (``expert_tp`` 1 under
    TP), a stage's TP x DP ranks in their numbering; and the ranks holding the same experts,
    one in each EP group."""
    folded = cfg.expert_tp == 1 and cfg.tp > 1
    if cfg.ep == 1 and not folded:
        return ExpertParallel()
    if cfg.cp > 1:
        raise ValueError("the harness's experts run without context parallelism (cp 1)")
    if cfg.expert_tp not in (None, 1, cfg.tp):
        raise ValueError(f"expert_tp {cfg.expert_tp}: the harness splits experts like the MLP "
                         "(tp) or keeps them whole (1)")
    me, ep_group, data_group, position = at(tp_rank, dp_rank, pp_rank), None, None, 0
    for p in range(cfg.pp):
        lanes = ([[at(t, d, p) for d in range(cfg.dp) for t in range(cfg.tp)]] if folded
                 else [[at(t, d, p) for d in range(cfg.dp)] for t in range(cfg.tp)])
        for lane in lanes:
            if len(lane) % cfg.ep:
                raise ValueError(f"ep ({cfg.ep}) must divide the {len(lane)} ranks it is "
                                 "drawn from")
            for first in range(0, len(lane), cfg.ep):
                group = dist.new_group(lane[first:first + cfg.ep])
                if me in lane[first:first + cfg.ep]:
                    ep_group, position = group, lane.index(me)
            for offset in range(cfg.ep) if len(lane) > cfg.ep else ():
                group = dist.new_group(lane[offset::cfg.ep])
                if me in lane[offset::cfg.ep]:
                    data_group = group
    return ExpertParallel(ep_group, cfg.ep, position % cfg.ep, data_group, folded)


def batch(cfg: RunConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step: token ids and next-token targets."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + step)
    tokens = torch.randint(0, cfg.shape.vocab, (cfg.global_batch, cfg.shape.seq_len + 1),
                           generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def chunk_modules(cfg: RunConfig, layers: list[nn.Module]) -> dict[int, nn.Module]:
    """Chunk c of pp*v gets its share of the blocks (embedding first, head last)."""
    chunks = cfg.pp * cfg.virtual_stages
    counts = even_split(cfg.shape.layers, chunks)
    blocks, start, out = layers[1:-1], 0, {}
    for c, n in enumerate(counts):
        mods = blocks[start:start + n]
        start += n
        if c == 0:
            mods = [layers[0], *mods]
        if c == chunks - 1:
            mods = [*mods, layers[-1]]
        out[c] = nn.Sequential(*mods)
    return out


def train(rank: int, world: int, cfg: RunConfig) -> dict:
    """Train ``cfg.steps`` steps; this rank's losses (last stage), step times, time per phase
    (forward, backward, pp_wait, grad_sync, optimizer) and memory."""
    sp = cfg.sequence_parallel and cfg.tp > 1
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" \
        else torch.device("cpu")
    g = make_groups(cfg, rank, sp)
    all_chunks = chunk_modules(cfg, build_layers(cfg.shape, g.tp, cfg.seed, g.ep, g.cp))
    owner = chunk_stages(cfg.pp, cfg.virtual_stages, schedule_named(cfg.schedule).placement)
    mine = {c: m.to(device) for c, m in all_chunks.items() if owner[c] == g.pp_rank}
    model = nn.ModuleList(mine.values())
    wrapped, optimizer = _data_parallel(cfg, model, g, device)
    if wrapped is not None:  # DDP or FSDP (pp == 1): the one chunk runs through its wrapper
        mine = {c: wrapped for c in mine}
    seq = cfg.shape.seq_len // cfg.cp // (cfg.tp if sp else 1)
    pipe = PipelineRank(mine, cfg.pp * cfg.virtual_stages, lambda s: g.rank_of_stage[s], cfg.pp,
                        (cfg.micro_batch, seq, cfg.shape.hidden), meter=ActivationMeter(model),
                        device=device, chunk_stages=owner)
    actions = with_communication(build_schedule(cfg.schedule, cfg.pp, cfg.microbatches,
                                                cfg.virtual_stages),
                                 cfg.pp * cfg.virtual_stages, owner)[g.pp_rank]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times, phases = [], [], []
    for step in range(cfg.steps):
        ids, targets = (t.to(device) for t in _replica_batch(cfg, step, g.dp_rank, g.cp))
        pipe.phases = clock = PhaseClock(device)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        pipe.losses.clear()
        with _autocast(cfg, device):
            run_actions(pipe, actions, list(ids.split(cfg.micro_batch)),
                        list(targets.split(cfg.micro_batch)), lm_loss, 1 / cfg.microbatches)
        with clock.phase("grad_sync"):
            _finish_grads(cfg, model, g, wrapped)
        with clock.phase("optimizer"):
            optimizer.step()
        times.append(time.perf_counter() - start)
        phases.append(clock.seconds)
        losses.append(_step_loss(cfg, pipe, g, device))
    return {"rank": rank, "losses": losses, "step_times": times, "phases": phases,
            "last_stage": g.pp_rank == owner[-1], "stage": g.pp_rank,
            **step_statistics(times), "memory": {**state_bytes(model, optimizer),
                                                 "activations": pipe.meter.peak},
            "cuda_max_allocated": (torch.cuda.max_memory_allocated(device)
                                   if device.type == "cuda" else None)}


def _autocast(cfg: RunConfig, device: torch.device):
    """bf16 autocast over forward and backward; fp32 runs get a context that does nothing."""
    if cfg.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {cfg.precision!r}: the harness trains fp32 or bf16")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")


def _replica_batch(cfg: RunConfig, step: int, dp_rank: int,
                   cp: ContextParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's slice of the step's global batch, this CP rank's part of each sequence."""
    ids, targets = batch(cfg, step)
    per_replica = cfg.microbatches * cfg.micro_batch
    mine = slice(dp_rank * per_replica, (dp_rank + 1) * per_replica)
    part = local_positions(cfg.shape.seq_len, cp)
    return ids[mine][:, part], targets[mine][:, part]


def _data_parallel(cfg: RunConfig, model: nn.Module, g: Groups, device: torch.device):
    """(wrapper or None, optimizer): DDP for ZeRO-0 without pipelining, the
    ZeroRedundancyOptimizer for ZeRO-1, FSDP2 for ZeRO-2 (gradients sharded, weights kept) and
    ZeRO-3 (weights resharded after use). With pipelining, gradients are all-reduced by hand
    after the schedule, as Megatron-LM's finalize step does."""
    params = list(model.parameters())
    if cfg.ep > 1 and cfg.zero and cfg.replicas > 1:
        raise ValueError("the harness shards no expert weights: zero 0 with ep > 1")
    if cfg.zero == 1 and cfg.replicas > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return None, ZeroRedundancyOptimizer(params, torch.optim.AdamW, g.dp_group, lr=cfg.lr)
    if cfg.zero in (2, 3) and cfg.replicas > 1:
        if cfg.pp > 1:
            raise ValueError("the harness runs ZeRO-2/3 (FSDP) without pipeline parallelism")
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        mesh = DeviceMesh.from_group(g.dp_group, device.type)
        root = _Call(model)
        for block in model.modules():
            if block.__class__.__name__ == "Block":
                fully_shard(block, mesh=mesh, reshard_after_forward=cfg.zero == 3)
        fully_shard(root, mesh=mesh, reshard_after_forward=cfg.zero == 3)
        return root, torch.optim.AdamW(root.parameters(), lr=cfg.lr)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    if cfg.replicas > 1 and cfg.pp == 1:
        from torch.nn.parallel import DistributedDataParallel
        root = _Call(model)
        if cfg.ep > 1 or g.ep.folded:  # experts' gradients: _finish_grads reduces them
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                root, [n for n, w in root.named_parameters() if getattr(w, "expert", False)])
        ddp = DistributedDataParallel(root, process_group=g.dp_group)
        return _SyncLast(ddp, cfg.microbatches), optimizer
    return None, optimizer


class _Call(nn.Module):
    """A ModuleList holding one chunk, callable as that chunk (for DDP and FSDP roots)."""

    def __init__(self, chunks: nn.ModuleList) -> None:
        super().__init__()
        self.chunks = chunks

    def forward(self, x):
        return self.chunks[0](x)


class _SyncLast(nn.Module):
    """DDP with gradient accumulation: only the last micro-batch's backward all-reduces (what
    ``no_sync`` does for the others); DDP reads the flag when the forward runs."""

    def __init__(self, ddp: nn.Module, microbatches: int) -> None:
        super().__init__()
        self.ddp, self.microbatches, self.calls = ddp, microbatches, 0

    def forward(self, x):
        self.calls += 1
        self.ddp.require_backward_grad_sync = self.calls % self.microbatches == 0
        return self.ddp(x)


def _finish_grads(cfg: RunConfig, model: nn.Module, g: Groups, wrapped) -> None:
    """Average the gradients over the replicas where no wrapper did: all of them when
    pipelined or under ZeRO-1, and spread or folded experts' always. An expert's gradient
    already sums its EP group's tokens (the all-to-all's backward brought them): it adds the
    other groups' over the ranks holding the same expert (folded, TP ranks among them)."""
    sync_sequence_parallel_grads(model, g.tp)
    for p in model.parameters():
        if p.grad is None:
            continue
        if (cfg.ep > 1 or g.ep.folded) and getattr(p, "expert", False):
            if g.ep.data_group is not None:
                dist.all_reduce(p.grad, group=g.ep.data_group)
            p.grad /= cfg.replicas
        elif cfg.replicas > 1 and wrapped is None:  # pipelined or ZeRO-1: average by hand
            dist.all_reduce(p.grad, group=g.dp_group)
            p.grad /= cfg.replicas


def _step_loss(cfg: RunConfig, pipe: PipelineRank, g: Groups,
               device: torch.device) -> float | None:
    """The global batch's mean loss, on last-stage ranks (others: None)."""
    local = torch.stack(pipe.losses).sum() if pipe.losses else torch.zeros((), device=device)
    if cfg.replicas > 1:
        dist.all_reduce(local, group=g.dp_group)
        local /= cfg.replicas
    return float(local) if pipe.losses else None
