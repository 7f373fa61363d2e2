"""Rules that span sections of a scenario (SCENARIO.md, "bad input").

Each rule raises ScenarioError naming the field a user should change, with the arithmetic that
failed in the message, so a reader sees at once why the split is impossible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.errors import ScenarioError
from clustersim.topologies.pools import cluster_pools, is_pooled

from ..pipeline.schedules import schedule_named, splits_backward
from ..pipeline.stages import scenario_layout, stage_layers
from .placement import context_levels
from .specs import ParallelSpec

if TYPE_CHECKING:
    from .scenario import Scenario


def with_data_parallel(parallel: ParallelSpec, gpus: int) -> ParallelSpec:
    """``parallel`` with ``dp`` set: derived as ``gpus / (tp*pp*cp)`` when left out."""
    mp = parallel.model_parallel
    if parallel.dp is None:
        if gpus % mp:
            raise ScenarioError(
                "parallel", f"tp*pp*cp = {parallel.tp}*{parallel.pp}*{parallel.cp} = {mp} "
                f"does not divide cluster.gpus = {gpus}")
        return parallel.model_copy(update={"dp": gpus // mp})
    if mp * parallel.dp != gpus:
        raise ScenarioError(
            "parallel.dp", f"tp*pp*dp*cp = {parallel.tp}*{parallel.pp}*{parallel.dp}*"
            f"{parallel.cp} = {mp * parallel.dp} must equal cluster.gpus = {gpus}")
    return parallel


def check_split(scenario: Scenario) -> None:
    """Rules on how the model is cut, checked before ``dp`` is derived from the GPU count,
    so that ``tp = 5`` is reported against the heads rather than as a bad product."""
    for rule in (_precision, _tensor_parallel, _pipeline, _combined_1f1b, _stage_layers,
                 _context, _op_sac):
        rule(scenario)


def check_replicas(scenario: Scenario) -> None:
    """Rules that need ``dp``: batch divisibility and expert placement."""
    for rule in (_batch, _experts, _hybrid_sharding):
        rule(scenario)


def _tensor_parallel(s: Scenario) -> None:
    tp, heads, kv = s.parallel.tp, s.model.heads, s.model.kv_heads
    if heads % tp:
        raise ScenarioError("parallel.tp", f"tp = {tp} must divide model.heads = {heads}")
    # Fewer KV heads than tp are replicated, as Megatron-LM does; otherwise tp splits them.
    if kv % tp and tp % kv:
        raise ScenarioError(
            "parallel.tp", f"model.kv_heads = {kv} must divide or be divisible by tp = {tp}")
    # The routed experts split etp ways (``expert_tp``), everything else tp.
    etp = s.parallel.etp if s.model.experts > 1 else tp
    for field, width, ways in (("ffn_hidden", s.model.ffn_hidden, etp),
                               ("dense_ffn_hidden", s.model.dense_ffn_hidden, tp),
                               ("shared_experts * shared_ffn_hidden", s.model.shared_width, tp)):
        if width and width % ways:
            raise ScenarioError("parallel.tp", f"tp = {ways} must divide model.{field} = {width}")
    if s.parallel.tp_comm_overlap and tp > 1:
        _userbuffers(s)
    if s.model.experts > 1 and tp > 1 and not s.parallel.sequence_parallel:
        # megatron/training/arguments.py: "When using MoE and tensor parallelism, sequence
        # parallelism must be used." (the token dispatcher routes each rank's 1/tp of them)
        raise ScenarioError("parallel.sequence_parallel",
                            f"MoE (model.experts = {s.model.experts}) with tp = {tp} needs "
                            "sequence_parallel: true (as in Megatron-LM)")
    if s.parallel.sequence_parallel and s.model.seq_len % (tp * s.parallel.cp):
        raise ScenarioError(
            "parallel.sequence_parallel",
            f"model.seq_len = {s.model.seq_len} must be divisible by tp*cp = {tp * s.parallel.cp}")


def _op_sac(s: Scenario) -> None:
    """torchtitan's op-level checkpointing (``recompute_modules: [op_sac]``, model/recompute.py)
    is costed for the dense Llama/GPT block it was written for, with the fused attention
    kernel whose output it saves; it is a whole policy, not a module to add to others."""
    if "op_sac" not in s.parallel.recomputed:
        return
    if len(s.parallel.recompute_modules or []) > 1:
        why = "lists other modules too: op_sac is a whole policy, list it alone"
    elif s.model.experts > 1 or s.model.mla or s.model.dense_layers:
        why = "is costed for dense layers (model.experts = 1) without latent attention"
    elif not s.training.flash_attention:
        why = "saves the fused attention kernel's output: set training.flash_attention: true"
    else:
        return
    source = " (framework fsdp's selective recomputation)" if s.training.framework == "fsdp" else ""
    raise ScenarioError("parallel.recompute_modules", f"op_sac{source} {why}; or set "
                        "recompute_modules: [core_attn], or recompute none or full")


def _userbuffers(s: Scenario) -> None:
    """What Transformer Engine's userbuffers overlap (``tp_comm_overlap``) runs with."""
    if not s.parallel.sequence_parallel:
        raise ScenarioError("parallel.tp_comm_overlap",
                            "needs parallel.sequence_parallel: true (as in Megatron-Core)")
    if splits_backward(s.parallel.schedule):
        # transformer_engine/pytorch/module/linear.py (and layernorm_linear.py,
        # layernorm_mlp.py): "Delayed weight grad computation is not supported with
        # Userbuffers (tensor-parallel communication overlapping)" -- NotImplementedError.
        raise ScenarioError(
            "parallel.tp_comm_overlap",
            f"schedule {s.parallel.schedule} defers weight gradients, which Transformer "
            "Engine refuses with userbuffers; set tp_comm_overlap: false or a schedule that "
            "does not split the backward")


def _batch(s: Scenario) -> None:
    per_step = s.parallel.dp * s.training.micro_batch
    if s.training.global_batch % per_step:
        raise ScenarioError(
            "training.global_batch",
            f"global_batch = {s.training.global_batch} must be divisible by dp*micro_batch = "
            f"{s.parallel.dp}*{s.training.micro_batch} = {per_step}")
    rule = schedule_named(s.parallel.schedule).microbatch_rule
    why = rule(s.parallel.pp, s.microbatches) if rule else None
    if why:
        raise ScenarioError(
            "training.global_batch",
            f"{s.parallel.schedule} schedule {why} (micro-batches per pipeline = "
            f"global_batch/(dp*micro_batch))")


def _precision(s: Scenario) -> None:
    for gpu in (pool.gpu for pool in cluster_pools(s.cluster)):
        if s.training.precision not in gpu.peak_flops:
            raise ScenarioError(
                "training.precision", f"{gpu.id} has no {s.training.precision} peak in the GPU "
                f"catalogue (it lists {', '.join(gpu.peak_flops)}): no tensor cores for it")
    if s.training.fp8_param_gather and s.training.precision != "fp8":
        raise ScenarioError("training.fp8_param_gather",
                            f"FP8 parameters need precision fp8, not {s.training.precision}")
    if s.training.autocast and s.training.precision not in ("bf16", "fp16"):
        raise ScenarioError("training.autocast", "autocast casts to bf16 or fp16: precision "
                            f"{s.training.precision} has nothing to cast to")
    if s.training.fp8_param_gather and s.parallel.zero == 0:
        # megatron/training/arguments.py asserts it: the distributed optimizer (or FSDP) keeps
        # the fp32 master copy the FP8 weights are cast from.
        raise ScenarioError("training.fp8_param_gather",
                            "FP8 parameters need the distributed optimizer: parallel.zero >= 1")
    _master(s)


def _master(s: Scenario) -> None:
    """A master kept as remainder bits needs bf16 weights to hold its high half (fp8 trains
    over bf16 weights, unless they are FP8 parameters); FP8 parameters are cast from a whole
    fp32 master (NeMo: ``fp8_params`` keeps ``store_params``; Megatron-LM's remainders need
    bf16 weights, megatron/core/optimizer/distrib_optimizer.py)."""
    t = s.training
    if t.master_weights == "remainders" and (t.precision not in ("bf16", "fp8")
                                             or t.fp8_param_gather):
        weights = "FP8 parameters" if t.fp8_param_gather else f"{t.precision} weights"
        raise ScenarioError("training.master_weights",
                            "remainders complete bf16 weights to their fp32 master; "
                            f"{weights} hold no fp32 high half")
    if t.master_weights == "none" and t.fp8_param_gather:
        raise ScenarioError("training.master_weights",
                            "FP8 parameters are cast from an fp32 master: none keeps none")


def _pipeline(s: Scenario) -> None:
    rule = schedule_named(s.parallel.schedule).pp_rule
    why = rule(s.parallel.pp) if rule else None
    if why:
        raise ScenarioError("parallel.pp", f"{s.parallel.schedule} schedule {why}")
    layout = scenario_layout(s)
    if layout.copies > 1 and s.parallel.zero == 3:
        raise ScenarioError(
            "parallel.zero", f"ZeRO-3 under {s.parallel.schedule}, whose ranks hold "
            f"{layout.copies} copies of the model, is not modelled; use zero 0, 1 or 2")
    if layout.copies > 1 and s.model.layers < layout.per_copy:
        raise ScenarioError(
            "parallel.pp", f"model.layers = {s.model.layers} is fewer than pp = "
            f"{s.parallel.pp}, the stages of each copy of the model")
    chunks = s.parallel.pp * s.parallel.virtual_stages
    spread = s.model.layers + (2 if s.parallel.layer_split == "ends_as_layers" else 0)
    if layout.copies == 1 and spread < chunks and s.parallel.stage_layers is None:
        raise ScenarioError(
            "parallel.pp", f"model.layers = {s.model.layers} is fewer than pp*virtual_stages = "
            f"{s.parallel.pp}*{s.parallel.virtual_stages} = {chunks}")


def _combined_1f1b(s: Scenario) -> None:
    """What Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``) runs with
    (``TransformerConfig.__post_init__``, megatron/core/transformer/transformer_config.py).
    Without expert parallelism, which Megatron-Core also asks for, its pairs hide nothing and
    it is interleaved 1F1B with one more warm-up forward (``reports/megatron.py`` says so)."""
    p = s.parallel
    if p.schedule != "combined-1f1b":
        return
    if p.pp > 1 and p.virtual_stages == 1:
        raise ScenarioError("parallel.virtual_stages", "combined-1f1b with pp > 1 runs "
                            "interleaved: set virtual_stages to 2 or more (as Megatron-Core)")
    if p.pp == 1 and p.virtual_stages > 1:
        raise ScenarioError("parallel.virtual_stages", "combined-1f1b without a pipeline "
                            "pairs one model's micro-batches: set virtual_stages to 1")
    if p.recompute == "full":
        raise ScenarioError("parallel.recompute", "combined-1f1b does not run with full "
                            "recomputation (Megatron-Core): use none or selective")


def _stage_layers(s: Scenario) -> None:
    layers = s.parallel.stage_layers
    if layers is None:
        _layer_split(s)
        return
    pp, v = s.parallel.pp, s.parallel.virtual_stages
    if scenario_layout(s).copies > 1:  # DualPipe: the stages of one copy, alike in both
        if len(layers) != pp:
            raise ScenarioError(
                "parallel.stage_layers",
                f"has {len(layers)} entries; {s.parallel.schedule} takes pp = {pp}, the layers "
                f"of each stage of a copy of the model (both copies alike)")
    elif len(layers) not in {pp, pp * v}:
        raise ScenarioError(
            "parallel.stage_layers",
            f"has {len(layers)} entries; expected pp = {pp} or pp*virtual_stages = {pp * v}")
    elif len(layers) == pp and v > 1 and any(n % v for n in layers):
        raise ScenarioError(
            "parallel.stage_layers",
            f"per-stage counts must split evenly into virtual_stages = {v} chunks; "
            f"give pp*virtual_stages = {pp * v} entries instead")
    if sum(layers) != s.model.layers:
        raise ScenarioError(
            "parallel.stage_layers",
            f"sums to {sum(layers)}; must sum to model.layers = {s.model.layers}")
    if 0 in layers[1:-1] or (0 in layers and len(layers) != pp * v):
        # Megatron-Core's --account-for-embedding-in-pipeline-split and -loss-: the model's
        # first chunk may hold its embedding alone and its last chunk the head alone.
        raise ScenarioError(
            "parallel.stage_layers",
            "only the model's first and last chunks may hold no layers (the embedding alone, "
            "the output layer alone), given per chunk (pp*virtual_stages entries)")
    per_stage = stage_layers(s)
    if 0 in per_stage:
        raise ScenarioError(
            "parallel.stage_layers", f"leaves a stage without layers ({per_stage} per stage); "
            "every stage must hold at least one")


def _layer_split(s: Scenario) -> None:
    """``layer_split: ends_as_layers`` (torchtitan's default) needs a share for every chunk
    and leaves no stage without layers, as torchtitan's own checks ask."""
    p = s.parallel
    parts = scenario_layout(s).per_copy
    if p.layer_split != "ends_as_layers" or parts == 1:
        return
    if s.model.layers + 2 < parts:
        raise ScenarioError(
            "parallel.layer_split", f"ends_as_layers spreads model.layers + 2 = "
            f"{s.model.layers + 2} over {parts} chunks: fewer than one each; use even")
    per_stage = stage_layers(s)
    if 0 in per_stage:
        raise ScenarioError(
            "parallel.layer_split", f"ends_as_layers leaves a stage without layers "
            f"({per_stage} per stage); use even or fewer stages")


def _context(s: Scenario) -> None:
    cp, m, p = s.parallel.cp, s.model, s.parallel
    # Megatron-LM splits the sequence into 2*cp chunks to balance causal attention.
    if cp > 1 and m.seq_len % (2 * cp):
        raise ScenarioError(
            "parallel.cp",
            f"model.seq_len = {m.seq_len} must be divisible by 2*cp = {2 * cp}")
    if cp == 1 or p.cp_comm == "p2p":
        return
    if m.mla:
        raise ScenarioError("parallel.cp_comm", f"{p.cp_comm}: latent attention (MLA) runs "
                            "context parallelism as the p2p ring here, as Megatron-Core does")
    if p.cp_comm == "a2a+p2p" and is_pooled(s.cluster):
        raise ScenarioError("parallel.cp_comm", "a2a+p2p on a cluster of pools is not "
                            "modelled: use p2p, allgather or a2a")
    # The all-to-alls hand each rank 1/ranks of its TP rank's heads, K/V heads too
    # (AttnFuncWithCPAndQKVOA2A: "num_heads % cp_size == 0 for Q, K, V").
    ranks = context_levels(s)[0]
    kv_heads = max(m.kv_heads // p.tp, 1)
    if ranks > 1 and ((m.heads // p.tp) % ranks or kv_heads % ranks):
        raise ScenarioError(
            "parallel.cp_comm", f"{p.cp_comm} splits each TP rank's heads over {ranks} "
            f"context-parallel ranks: heads/tp = {m.heads // p.tp} and kv heads per rank = "
            f"{kv_heads} must both be divisible by it; use p2p or allgather")


def _experts(s: Scenario) -> None:
    _expert_tensor_parallel(s)
    p, experts = s.parallel, s.model.experts
    ep = p.ep
    if ep == 1:
        return
    if experts % ep:
        raise ScenarioError("parallel.ep", f"ep = {ep} must divide model.experts = {experts}")
    if p.folded and (p.tp * p.dp * p.cp) % ep:
        raise ScenarioError(
            "parallel.ep", f"ep = {ep} must divide tp*dp*cp = {p.tp * p.dp * p.cp} (with "
            "expert_tp 1 experts are split over a stage's tensor- and data-parallel ranks)")
    if not p.folded and (p.dp * p.cp) % ep:
        raise ScenarioError(
            "parallel.ep", f"ep = {ep} must divide dp*cp = {p.dp * p.cp} "
            "(experts are split over data-parallel ranks; expert_tp: 1 folds them over the "
            "tensor-parallel ranks too)")
    if s.parallel.moe_dispatcher == "deepep" and is_pooled(s.cluster):
        raise ScenarioError("parallel.moe_dispatcher", "deepep on a cluster of pools is not "
                            "modelled: use alltoall")


def _expert_tensor_parallel(s: Scenario) -> None:
    """``expert_tp``: tp, or 1 (MoE parallel folding) over a stage's contiguous ranks."""
    p = s.parallel
    if p.expert_tp is None or p.expert_tp == p.tp:
        return
    if s.model.experts == 1:
        raise ScenarioError("parallel.expert_tp", "expert_tp splits the routed experts of an "
                            "MoE model (model.experts > 1): leave it out")
    if p.expert_tp != 1:
        raise ScenarioError("parallel.expert_tp", f"expert_tp = {p.expert_tp}: 1 (whole "
                            f"experts) or tp = {p.tp} are modelled")
    dims = p.order.split("-")
    if dims[0] != "tp" or dims[-1] != "pp":
        raise ScenarioError("parallel.expert_tp", f"expert_tp 1 folds experts over a stage's "
                            f"consecutive ranks: order must start with tp and end with pp "
                            f"(got {p.order!r})")
    if is_pooled(s.cluster):
        raise ScenarioError("parallel.expert_tp", "expert_tp 1 on a cluster of pools is not "
                            "modelled: leave it out")


def _hybrid_sharding(s: Scenario) -> None:
    p = s.parallel
    if p.dp_shard is None or p.dp_shard == p.dp:
        return
    if p.dp % p.dp_shard:
        raise ScenarioError("parallel.dp_shard",
                            f"dp_shard = {p.dp_shard} must divide dp = {p.dp}")
    if p.zero == 0:
        raise ScenarioError("parallel.dp_shard", "hybrid sharding splits ZeRO's states: set "
                            "parallel.zero to 1, 2 or 3, or leave dp_shard out")
    if p.ep > 1 or p.folded:
        raise ScenarioError("parallel.dp_shard", "hybrid sharding with expert parallelism "
                            "(ep > 1 or expert_tp 1) is not modelled: leave dp_shard out")
