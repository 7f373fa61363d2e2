"""The parallel split of a scenario: how the model and the batch are cut over GPUs.

A frozen pydantic section like those of ``specs.py``, which re-exports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from clustersim.fields import NonNegativeInt, PositiveInt

from ..pipeline.schedules import SCHEDULES
from .placement import DEFAULT_ORDER, parse_order
from .spec_base import Recompute, RecomputeModule, ZeroStage, _Section


class ParallelSpec(_Section):
    """How the model and batch are split over GPUs; ``dp=None`` is derived by the scenario."""

    tp: PositiveInt = Field(
        1, description="tensor parallelism (Megatron-style, within a node in sane placements)")
    pp: PositiveInt = Field(1, description="pipeline stages")
    dp: PositiveInt | None = Field(
        None, description="data-parallel replicas; null: derived as gpus / (tp * pp * cp)")
    cp: PositiveInt = Field(1, description="context parallelism (sequence split over ranks)")
    ep: PositiveInt = Field(1, description="expert parallelism (MoE experts split over ranks)")
    # Beyond SCENARIO.md: MoE parallel folding (Megatron-Core's --expert-tensor-parallel-size;
    # Liu et al. 2025, arXiv 2504.14960).
    expert_tp: PositiveInt | None = Field(
        None, description=(
            "tensor parallelism of the routed experts: tp (each expert split like the dense "
            "MLP, the dispatched tokens gathered over the TP group) or 1 (MoE parallel "
            "folding: whole experts, the EP group drawn from all tp * cp * dp ranks of a "
            "stage, ep dividing them); Megatron-Core's --expert-tensor-parallel-size; null: tp"))
    schedule: str = Field(
        "1f1b", description=(
            "pipeline schedule: gpipe, 1f1b, interleaved (1F1B with virtual stages), zb-h1 "
            "and zb-h2 (zero bubble: backward split into input- and weight-gradient halves; "
            "zb-h2 holds up to 2 pp - 1 micro-batches), zb-v and "
            "dualpipev (two chunks per rank in a V, virtual_stages 2), dualpipe (two copies "
            "of the model in opposite directions, even pp, virtual_stages 2), combined-1f1b "
            "(interleaved with each steady forward and backward overlapping one another's "
            "expert all-to-alls: Megatron-Core's --overlap-moe-expert-parallel-comm), or one "
            "registered with `schedules.register_schedule`"))
    virtual_stages: PositiveInt = Field(
        1, description="model chunks per pipeline rank (interleaved only)")
    stage_layers: list[NonNegativeInt] | None = Field(
        None, description=(
            "layers per stage (pp entries) or per chunk (pp * virtual_stages; the first and "
            "last may be 0: a chunk holding the embedding or the output layer alone, Megatron-"
            "Core's --account-for-embedding/loss-in-pipeline-split); null: as even as "
            "possible, first stages taking the remainder"))
    layer_split: Literal["even", "ends_as_layers"] = Field(
        "even", description=(
            "how the layers spread over the pipeline's chunks when stage_layers is null: even "
            "(the first chunks taking the remainder), or ends_as_layers: the embedding and the "
            "output layer each count as one layer, so the first and last chunks hold one layer "
            "fewer (Megatron-Core's --account-for-embedding-in-pipeline-split and "
            "--account-for-loss-in-pipeline-split; torchtitan's default first/last-stage "
            "weights of 1); left out: the framework's (ends_as_layers under fsdp)"))
    stage_pools: list[NonNegativeInt] | None = Field(
        None, description=(
            "pool of each pipeline stage (index into cluster.pools), pp entries; each pool's "
            "GPUs must be whole stages of tp * cp * dp; null: stages fill the pools in order"))
    zero: ZeroStage = Field(
        0, description=(
            "ZeRO stage: 1 shards optimizer state, 2 also gradients (reduce-scattered every "
            "micro-batch; with pp > 1 once a step, as PyTorch's pipelining does), 3 also "
            "parameters, over the dp * cp ranks; left out: the framework's (0 but fsdp)"))
    dp_shard: PositiveInt | None = Field(
        None, description=(
            "hybrid sharding: the data-parallel ranks one copy of the ZeRO-sharded states "
            "spans (times cp); the dp / dp_shard copies each hold it whole and all-reduce "
            "their shards' gradients (PyTorch FSDP's HYBRID_SHARD and torchtitan's "
            "data_parallel_shard_degree, Megatron-LM's --num-distributed-optimizer-instances "
            "dp/dp_shard); null: all dp ranks (plain ZeRO)"))
    sequence_parallel: bool = Field(
        False, description=(
            "Megatron sequence parallelism: norms and dropout split along the sequence within "
            "the TP group"))
    recompute: Recompute = Field(
        "none", description=(
            "activation recomputation: selective (the attention core; under framework fsdp "
            "torchtitan's op-level policy, recompute_modules) or full (whole layers)"))
    recompute_modules: list[RecomputeModule] | None = Field(
        None, description=(
            "with recompute: selective, what is recomputed (Megatron-Core's "
            "--recompute-modules): core_attn (attention scores), layernorm (norm outputs that "
            "feed several GEMMs: MLA's and MoE's), mla_up_proj (MLA's per-head Q, K, V), mlp "
            "(a dense layer's whole MLP, its TP collectives too), moe_act "
            "(the experts' activation output), op_sac (torchtitan's op-level selective "
            "checkpointing, alone: every second matmul and every non-matmul op re-run); null: "
            "the framework's ([core_attn], Megatron-Core's; [op_sac] under fsdp)"))
    overlap_grad_reduce: bool = Field(
        True, description=(
            "reduce gradient buckets during backward (Megatron's overlap_grad_reduce); left "
            "out: the framework's (true for megatron)"))
    overlap_param_gather: bool = Field(
        True, description=(
            "gather ZeRO-1/2 parameters at the start of the step, beside compute, instead "
            "of after the optimizer (Megatron's overlap_param_gather); left out: the "
            "framework's (true for megatron)"))
    zero3_prefetch: NonNegativeInt = Field(
        1, description=("ZeRO-3 units gathered ahead of the running one (FSDP's one-unit "
                        "prefetch; 0: none); overlap_param_gather false means 0"))
    # Beyond SCENARIO.md: when ZeRO-3 reduces its gradients under a pipeline.
    zero3_pipeline_reduce: Literal["microbatch", "step"] = Field(
        "microbatch", description=(
            "ZeRO-3 under a pipeline (pp > 1): microbatch reduce-scatters each unit's "
            "gradients after its backward, every micro-batch (Megatron-FSDP, which syncs in its "
            "gradient-sharding modes even inside no_sync); step keeps whole gradients and "
            "reduces them once after the last backward, each unit left gathered from its "
            "backward to its next forward (PyTorch's pipelining with FSDP2, torchtitan); left "
            "out: the framework's"))
    # Beyond SCENARIO.md: how a pipeline send is split over the TP ranks without sequence
    # parallelism (Narayanan et al. 2021, sec. 4.1, "scatter/gather communication").
    pp_scatter_gather: bool = Field(
        True, description=(
            "without sequence parallelism, each TP rank sends 1/tp of the activation to the "
            "next stage and the receiving TP group all-gathers it over NVLink (Megatron-LM's "
            "--scatter-gather-tensors-in-pipeline, DeepSpeed's partitioned pipe sends); false: "
            "every TP rank sends the whole activation (Megatron-Core's p2p, PyTorch "
            "pipelining); left out: the framework's"))
    # Beyond SCENARIO.md: whether a pipeline send blocks its sender (Megatron-LM's
    # overlap_p2p_comm, on for its interleaved schedule).
    overlap_p2p_comm: bool = Field(
        False, description=(
            "pipeline sends are asynchronous: the sender runs on while its message travels "
            "and pays only what its compute loses beside the transfer (comm_compute_slowdown "
            "of it); false: a send blocks its sender until the message is through; left "
            "out: the framework's (megatron: true with the interleaved schedule, as "
            "Megatron-LM's overlap_p2p_comm; fsdp: true; deepspeed: false)"))
    # Beyond SCENARIO.md: what a column-parallel layer keeps of its sequence-parallel input.
    tp_keeps_gathered_inputs: bool = Field(
        False, description=(
            "with sequence parallelism, the column-parallel layers (QKV, FC1, the output layer) "
            "keep their all-gathered input for backward and gather nothing again there "
            "(torchtitan's DTensor plan: PrepareModuleInput gathers before the matmul); "
            "false: each keeps its sequence shard and gathers it again for the weight "
            "gradient (Megatron-LM's ColumnParallelLinear); left out: the framework's"))
    # Beyond SCENARIO.md: hide TP collectives behind the GEMMs they feed (Megatron-Core's
    # --tp-comm-overlap, which needs sequence parallelism).
    tp_comm_overlap: bool = Field(
        False, description=(
            "hide TP collectives behind the GEMMs they feed (Megatron-Core --tp-comm-overlap; "
            "needs sequence_parallel)"))
    # Beyond SCENARIO.md: Megatron-LM's asynchronous backward TP collectives.
    tp_backward_overlap: bool = Field(
        True, description=(
            "the column-parallel layers' backward TP collectives run beside their GEMMs "
            "(Megatron-LM's default); false: every TP collective waits (Megatron-DeepSpeed "
            "without sequence parallelism, plain PyTorch, the real-run harness); left out: "
            "the framework's"))
    # Beyond SCENARIO.md: how context-parallel ranks share keys and values (Megatron-Core's
    # --cp-comm-type).
    cp_comm: Literal["p2p", "allgather", "a2a", "a2a+p2p"] = Field(
        "p2p", description=(
            "how the context-parallel ranks share the sequence: p2p (ring attention: each "
            "rank's K/V block passed round the ring behind the attention it meets), allgather "
            "(K and V all-gathered before the attention and their gradients reduce-scattered "
            "after it, exposed: Llama 3's and torchtitan's), a2a (all-to-alls turning Q, K, V "
            "into whole sequences of heads/cp heads, and the output back, exposed: "
            "DeepSpeed-Ulysses), a2a+p2p (the all-to-alls among a node's context-parallel "
            "ranks, the ring across nodes); Megatron-Core's --cp-comm-type; left out: the "
            "framework's"))
    # Beyond SCENARIO.md: how an MoE layer's tokens cross nodes to their experts (Megatron-
    # Core's --moe-token-dispatcher-type alltoall, or flex with the DeepEP backend).
    moe_dispatcher: Literal["alltoall", "deepep"] = Field(
        "alltoall", description=(
            "how the token dispatch and combine reach experts on other nodes: alltoall (every "
            "routed copy sent to its expert's rank: Megatron-Core's alltoall dispatcher), "
            "deepep (each token sent once to every node holding one of its experts, to the "
            "GPU of the same index, and forwarded there over NVLink: DeepEP's normal kernels, "
            "Megatron-Core's flex dispatcher); the same inside one node"))
    # Beyond SCENARIO.md: rank numbering, innermost dimension first (Megatron-LM's default).
    order: str = Field(
        DEFAULT_ORDER, description=(
            "rank numbering, innermost dimension first (Megatron-LM's default tp-cp-dp-pp)"))

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, name: str) -> str:
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r} (valid: {', '.join(SCHEDULES)})")
        return name

    @field_validator("order")
    @classmethod
    def _known_order(cls, order: str) -> str:
        parse_order(order)
        return order

    @model_validator(mode="after")
    def _schedule_rules(self) -> ParallelSpec:
        if self.virtual_stages > 1 and not SCHEDULES[self.schedule].chunks_per_rank:
            several = [name for name, sched in SCHEDULES.items() if sched.chunks_per_rank]
            raise ValueError(f"virtual_stages > 1 needs a schedule with several chunks per rank "
                             f"({', '.join(several)}; got {self.schedule!r})")
        counts = SCHEDULES[self.schedule].chunk_counts
        if counts is not None and self.virtual_stages not in counts:
            raise ValueError(f"schedule {self.schedule!r} runs "
                             f"{' or '.join(map(str, counts))} chunks per rank: set "
                             f"virtual_stages: {counts[0]} (got {self.virtual_stages})")
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ValueError("recompute_modules choose what selective recomputation re-runs: "
                             f"set recompute: selective (got {self.recompute!r})")
        return self

    @property
    def gathered_inputs_kept(self) -> bool:
        """Whether column-parallel layers keep their all-gathered input for backward
        (``tp_keeps_gathered_inputs`` where sequence parallelism splits it and no op-level
        checkpointing re-runs the gathers)."""
        return (self.tp > 1 and self.sequence_parallel and self.tp_keeps_gathered_inputs
                and "op_sac" not in self.recomputed)

    @property
    def recomputed(self) -> frozenset[str]:
        """The modules selective recomputation re-runs (none unless ``recompute`` is
        selective; Megatron-Core's default ``core_attn`` when not listed)."""
        if self.recompute != "selective":
            return frozenset()
        listed = self.recompute_modules
        return frozenset(["core_attn"] if listed is None else listed)

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans, without data parallelism: ``tp * pp * cp``."""
        return self.tp * self.pp * self.cp

    @property
    def etp(self) -> int:
        """The routed experts' tensor-parallel degree: ``expert_tp``, else ``tp``."""
        return self.expert_tp or self.tp

    @property
    def folded(self) -> bool:
        """Whether the experts' parallelism folds over the attention's TP ranks (``etp`` below
        ``tp``): the EP group is carved out of a stage's ``tp * cp * dp`` ranks, not only its
        replicas."""
        return self.etp < self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts, over which their gradients reduce and their ZeRO
        states shard: ``tp * cp * dp / (etp * ep)`` (Megatron-Core's expert-data-parallel
        group; ``dp * cp / ep`` where ``etp = tp``)."""
        return max(self.tp * self.cp * (self.dp or 1) // (self.etp * self.ep), 1)

    @property
    def hybrid_sharded(self) -> bool:
        """Whether ZeRO's states shard over part of the data-parallel ranks only
        (``dp_shard`` below ``dp``), each such group holding a whole copy."""
        return self.zero >= 1 and self.dp_shard is not None and self.dp_shard < (self.dp or 1)

    @property
    def state_shards(self) -> int:
        """Ranks one copy of the dense ZeRO states shards over: ``dp_shard * cp`` under
        hybrid sharding, else every ``dp * cp`` replica (ZeRO paper, sec. 5: N_d)."""
        return (self.dp_shard if self.hybrid_sharded else (self.dp or 1)) * self.cp

    @property
    def state_copies(self) -> int:
        """Copies of the sharded states, whose shards' gradients are all-reduced: ``dp /
        dp_shard`` under hybrid sharding, else 1."""
        return (self.dp or 1) * self.cp // self.state_shards

    @property
    def sharded_gradients(self) -> bool:
        """Whether each rank keeps only its gradient shard, so that every micro-batch's
        gradients are reduce-scattered into it: ZeRO-3 (but ``deferred_zero3``), and ZeRO-2
        without a pipeline.

        With ``pp > 1`` ZeRO-2 keeps whole gradients like ZeRO-1 and reduce-scatters them once
        a step: PyTorch's pipelining turns FSDP's gradient sync off for every backward and
        reduces after the last one (``set_requires_gradient_sync(False)`` in
        ``backward_maybe_with_nosync``, then ``perform_reduce_grad``,
        torch/distributed/pipelining/stage.py), and DeepSpeed's pipeline engine refuses
        ZeRO-2 outright. ZeRO-3 does the same there (``zero3_pipeline_reduce: step``) or
        keeps its every-micro-batch reduce-scatters (``microbatch``, Megatron-FSDP).
        """
        return (self.zero == 3 and not self.deferred_zero3) or (self.zero == 2 and self.pp == 1)

    @property
    def deferred_zero3(self) -> bool:
        """ZeRO-3 as PyTorch's pipelining runs it (pp > 1, ``zero3_pipeline_reduce: step``):
        whole gradients reduced once after the last backward, and each unit gathered when a
        pass finds it sharded: FSDP reshards it after a forward and, under the pipelining's
        ``set_reshard_after_backward(False)``, not after a backward (``zero3.gathering_passes``)."""
        return self.zero == 3 and self.pp > 1 and self.zero3_pipeline_reduce == "step"

