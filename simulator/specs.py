"""Validated specs of one scenario: model shape, training settings and parallel split.

Each section is a frozen pydantic model that refuses unknown keys, negative sizes and
booleans where numbers belong; rules that span sections live in ``scenario.py``.
Units follow SCENARIO.md: batch sizes in sequences.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from clustersim.fields import (
    AtLeastOne,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    Tokens,
    no_bool,
)

from .placement import DEFAULT_ORDER, parse_order
from .schedules import SCHEDULES

FfnKind = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "none"]
Precision = Literal["bf16", "fp16", "fp32", "fp8"]
GradPrecision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adam", "sgd"]
Framework = Literal["megatron", "deepspeed", "fsdp"]
MasterWeights = Literal["optimizer", "params"]
Recompute = Literal["none", "selective", "full"]
# Megatron-Core's selective-recomputation modules that clustersim costs (transformer_config.py,
# ``recompute_modules``; its default is ["core_attn"]).
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "moe_act"]
ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(no_bool)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Section):
    """A decoder-only transformer (dense, or MoE when ``experts > 1``)."""

    name: str = Field(
        "custom", description="label in reports (a preset's or imported config's name)")
    layers: PositiveInt = Field(description="transformer layers")
    hidden: PositiveInt = Field(description="hidden size h")
    heads: PositiveInt = Field(description="attention heads a")
    kv_heads: PositiveInt | None = Field(
        None, description="key/value heads for GQA/MQA; null: as many as heads (MHA)")
    ffn_hidden: PositiveInt | None = Field(
        None, description="MLP width f (per expert for MoE); null: 4 * hidden")
    ffn_kind: FfnKind = Field(
        "gelu", description="gelu: 2 MLP matrices; swiglu: 3 (gate, up, down)")
    vocab: PositiveInt = Field(description="vocabulary size V")
    seq_len: PositiveInt = Field(description="tokens per sequence s")
    experts: PositiveInt = Field(1, description="MoE experts per layer (1: dense)")
    top_k: PositiveInt = Field(1, description="experts each token is routed to")
    # MoE routing: expert buffers of capacity_factor * tokens * top_k / experts slots, padded or
    # dropped to it (None: dropless, as Megatron-Core's default); the busiest expert-parallel
    # rank's routed tokens over the mean when dropless (1: balanced).
    capacity_factor: PositiveFloat | None = Field(
        1.0, description=("MoE expert capacity as a multiple of the balanced share; tokens "
                          "beyond it are dropped, short buffers padded; null: dropless"))
    expert_imbalance: AtLeastOne = Field(
        1.0, description=("dropless MoE: routed tokens of the busiest expert-parallel rank "
                          "over the mean (1: balanced)"))
    # DeepSeekMoE (Dai et al. 2024, arXiv 2401.06066, sec. 3.2; DeepSeek-V3 report arXiv
    # 2412.19437 sec. 2.1.2): always-active shared experts beside the routed ones, and the first
    # layers dense (the HF configs' n_shared_experts, first_k_dense_replace, intermediate_size).
    shared_experts: NonNegativeInt = Field(
        0, description=("MoE: shared experts every token passes through beside its top_k "
                        "routed ones (DeepSeekMoE; HF n_shared_experts), run as one dense MLP "
                        "of shared_experts * shared_ffn_hidden"))
    shared_ffn_hidden: PositiveInt | None = Field(
        None, description="MLP width of each shared expert; null: ffn_hidden (a routed expert's)")
    dense_layers: NonNegativeInt = Field(
        0, description=("MoE: the first k layers have one dense MLP of dense_ffn_hidden instead "
                        "of experts (HF first_k_dense_replace; DeepSeek-V3: 3)"))
    dense_ffn_hidden: PositiveInt | None = Field(
        None, description="MLP width of the dense first layers (needed with dense_layers)")
    # Multi-head latent attention (DeepSeek-V2 report arXiv 2405.04434 sec. 2.1.2-2.1.3).
    q_lora_rank: PositiveInt | None = Field(
        None, description=("MLA: rank of the query down-projection d_c'; null: a full-rank "
                           "query projection (DeepSeek-V2-Lite)"))
    kv_lora_rank: PositiveInt | None = Field(
        None, description=("MLA: rank of the joint key-value latent d_c; set, the attention is "
                           "multi-head latent attention (null: MHA/GQA)"))
    qk_nope_head_dim: PositiveInt | None = Field(
        None, description="MLA: per-head query/key width without RoPE d_h")
    qk_rope_head_dim: PositiveInt | None = Field(
        None, description="MLA: per-head query width with RoPE d_h^R (the key's is shared)")
    v_head_dim: PositiveInt | None = Field(None, description="MLA: per-head value width")
    # Beyond SCENARIO.md's list; defaults are GPT-2/3 and Megatron-LM's.
    norm: Norm = Field("layernorm", description="layernorm: weight and bias; rmsnorm: weight only")
    bias: bool = Field(True, description="linear layers carry biases")
    position_embedding: PositionEmbedding = Field(
        "learned", description="learned: a seq_len x hidden table; rope or none: no weights")
    tie_embeddings: bool = Field(
        True, description="the output layer shares the input embedding's weights")
    # Megatron-LM's hidden_dropout and attention_dropout default to 0.1; Llama, Mixtral and
    # DeepSeek train without dropout (their HF configs: attention_dropout 0.0), and at 0 no
    # dropout mask is kept for backward (torch's dropout returns its input when p == 0).
    dropout: Probability = Field(
        0.1, description=("hidden and attention dropout probability (Megatron-LM's default "
                          "0.1); 0: no dropout, so no masks are kept for backward"))

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: dict) -> dict:
        if isinstance(data, dict):
            data = dict(data)
            if data.get("kv_heads") is None and "heads" in data:
                data["kv_heads"] = data["heads"]
            if data.get("ffn_hidden") is None and isinstance(data.get("hidden"), int):
                data["ffn_hidden"] = 4 * data["hidden"]
        return data

    @model_validator(mode="after")
    def _shape_rules(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        self._deepseek_moe_rules()
        self._latent_attention_rules()
        return self

    def _deepseek_moe_rules(self) -> None:
        moe = self.experts > 1
        if self.shared_experts and not moe:
            raise ValueError("shared_experts sit beside routed experts: they need experts > 1 "
                             "(a dense model's MLP width is ffn_hidden)")
        if self.shared_ffn_hidden is not None and not self.shared_experts:
            raise ValueError("shared_ffn_hidden is given but shared_experts is 0")
        if self.dense_layers and not moe:
            raise ValueError("dense_layers replace the experts of the first layers: they need "
                             "experts > 1")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be fewer than layers "
                             f"({self.layers})")
        if self.dense_layers and self.dense_ffn_hidden is None:
            raise ValueError("dense_layers needs dense_ffn_hidden, the dense MLPs' width")
        if self.dense_ffn_hidden is not None and not self.dense_layers:
            raise ValueError("dense_ffn_hidden is given but dense_layers is 0")

    def _latent_attention_rules(self) -> None:
        parts = {"q_lora_rank": self.q_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
                 "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim}
        if not self.mla:
            given = [k for k, v in parts.items() if v is not None]
            if given:
                raise ValueError(f"{given[0]} is a latent-attention field: set kv_lora_rank "
                                 "too, or leave it out")
            return
        missing = [k for k, v in parts.items() if v is None and k != "q_lora_rank"]
        if missing:
            raise ValueError(f"multi-head latent attention (kv_lora_rank) needs {missing[0]}")
        if self.kv_heads != self.heads:
            raise ValueError(f"latent attention up-projects keys and values for every head: "
                             f"kv_heads ({self.kv_heads}) must equal heads ({self.heads})")
        if self.bias:
            raise ValueError("latent attention with bias: true is not modelled (DeepSeek's "
                             "projections have no biases): set bias: false")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def mla(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys: ``qk_nope + qk_rope`` under MLA, else
        ``head_dim``."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Per-head width of values (and of the attention output): ``v_head_dim`` or
        ``head_dim``."""
        return self.v_head_dim if self.mla else self.head_dim

    @property
    def shared_width(self) -> int:
        """Width of the shared experts run as one MLP: ``shared_experts * shared_ffn_hidden``
        (Megatron-Core's moe_shared_expert_intermediate_size)."""
        return self.shared_experts * (self.shared_ffn_hidden or self.ffn_hidden)

    def dense_layer_spec(self) -> ModelSpec:
        """The model as its dense first layers see it: the same attention, one MLP of
        ``dense_ffn_hidden``, no experts; per-layer costs of those layers come from it."""
        return self.model_copy(update={
            "experts": 1, "top_k": 1, "ffn_hidden": self.dense_ffn_hidden,
            "shared_experts": 0, "shared_ffn_hidden": None, "dense_layers": 0,
            "dense_ffn_hidden": None, "capacity_factor": 1.0, "expert_imbalance": 1.0})

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one MLP: 2 for gelu, 3 for swiglu (gate, up, down)."""
        return 3 if self.ffn_kind == "swiglu" else 2


class TrainingSpec(_Section):
    """Batch sizes, numeric precision, optimizer and training stack of one optimizer step.

    ``grad_dtype`` is the type gradients are accumulated, stored and reduced in, and
    ``master_weights`` where the fp32 master copy lives; left out (null), both take the
    ``framework``'s default (``frameworks.py``, docs/frameworks.md): Megatron-LM keeps fp32
    "main grads" under bf16 (``accumulate_allreduce_grads_in_fp32`` is forced on for bf16 in
    megatron/training/arguments.py) and the training precision otherwise; ``bf16`` gives the
    ZeRO paper's 16 bytes per parameter. ``Scenario`` holds them resolved.
    """

    global_batch: PositiveInt = Field(description="sequences per optimizer step B")
    micro_batch: PositiveInt = Field(1, description="sequences per micro-batch b")
    precision: Precision = Field(
        "bf16", description="weights, gradients and activations; bf16/fp16 train in mixed "
                            "precision with an fp32 master copy in the optimizer state; fp8 "
                            "as Transformer Engine: the layers' weight GEMMs in FP8 "
                            "(E4M3 forward, E5M2 gradients), everything else in bf16")
    grad_dtype: GradPrecision | None = Field(
        None, description=("type gradients are accumulated, kept and reduced in; null: the "
                           "framework's (megatron: fp32 under bf16 and fp8, Megatron-LM's "
                           "main grads; else the precision)"))
    optimizer: Optimizer = Field(
        "adam", description="optimizer state per parameter in mixed precision: adam 12 bytes "
                            "(master, two moments), sgd with momentum 8")
    tokens: Tokens | None = Field(
        None, description="tokens to train on; gives time_to_train_s")
    flash_attention: bool = Field(
        True, description="fused attention: no s x s score matrices are kept for backward")
    framework: Framework = Field(
        "megatron", description=(
            "the training stack whose defaults fill the fields left out: gradient dtype, "
            "where the master weights live, ZeRO stage, reduction and gather overlap "
            "(docs/frameworks.md); fields given explicitly override it"))
    attention_kernel: Literal["flash2", "flash3"] | None = Field(
        None, description=(
            "fused attention kernels: flash2 (FlashAttention-2, also PyTorch SDPA's flash "
            "backend) or flash3 (Hopper's FlashAttention-3 class: FA3, or cuDNN's fused "
            "attention that Transformer Engine picks on H100); a GPU without flash3 figures "
            "runs flash2's; null: the framework's"))
    master_weights: MasterWeights | None = Field(
        None, description=(
            "where the fp32 master copy lives under bf16/fp16/fp8: optimizer (beside the "
            "training-precision weights, in the optimizer state: Megatron-LM, DeepSpeed) or "
            "params (the parameters are fp32 and are the master, cast per use: FSDP; under "
            "ZeRO-3 a shard is 4 + 4 + 8 bytes per parameter); null: the framework's"))


class ParallelSpec(_Section):
    """How the model and batch are split over GPUs; ``dp=None`` is derived by the scenario."""

    tp: PositiveInt = Field(
        1, description="tensor parallelism (Megatron-style, within a node in sane placements)")
    pp: PositiveInt = Field(1, description="pipeline stages")
    dp: PositiveInt | None = Field(
        None, description="data-parallel replicas; null: derived as gpus / (tp * pp * cp)")
    cp: PositiveInt = Field(1, description="context parallelism (sequence split over ranks)")
    ep: PositiveInt = Field(1, description="expert parallelism (MoE experts split over ranks)")
    schedule: str = Field(
        "1f1b", description=(
            "pipeline schedule: gpipe, 1f1b, interleaved (1F1B with virtual stages), zb-h1 "
            "and zb-h2 (zero bubble: backward split into input- and weight-gradient halves; "
            "zb-h2 holds up to 2 pp - 1 micro-batches), zb-v and "
            "dualpipev (two chunks per rank in a V, virtual_stages 2), dualpipe (two copies "
            "of the model in opposite directions, even pp, virtual_stages 2), or one "
            "registered with `schedules.register_schedule`"))
    virtual_stages: PositiveInt = Field(
        1, description="model chunks per pipeline rank (interleaved only)")
    stage_layers: list[PositiveInt] | None = Field(
        None, description=(
            "layers per stage (pp entries) or per chunk (pp * virtual_stages); null: as even "
            "as possible, first stages taking the remainder"))
    stage_pools: list[NonNegativeInt] | None = Field(
        None, description=(
            "pool of each pipeline stage (index into cluster.pools), pp entries; each pool's "
            "GPUs must be whole stages of tp * cp * dp; null: stages fill the pools in order"))
    zero: ZeroStage = Field(
        0, description=(
            "ZeRO stage: 1 shards optimizer state, 2 also gradients (reduce-scattered every "
            "micro-batch; with pp > 1 once a step, as PyTorch's pipelining does), 3 also "
            "parameters, over the dp * cp ranks; left out: the framework's (0 but fsdp)"))
    sequence_parallel: bool = Field(
        False, description=(
            "Megatron sequence parallelism: norms and dropout split along the sequence within "
            "the TP group"))
    recompute: Recompute = Field(
        "none", description=(
            "activation recomputation: selective (attention core) or full (whole layers)"))
    recompute_modules: list[RecomputeModule] | None = Field(
        None, description=(
            "with recompute: selective, what is recomputed (Megatron-Core's "
            "--recompute-modules): core_attn (attention scores), layernorm (norm outputs that "
            "feed several GEMMs: MLA's and MoE's), mla_up_proj (MLA's per-head Q, K, V), moe_act "
            "(the experts' activation output); null: [core_attn], Megatron-Core's default"))
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
    # Beyond SCENARIO.md: hide TP collectives behind the GEMMs they feed (Megatron-Core's
    # --tp-comm-overlap, which needs sequence parallelism).
    tp_comm_overlap: bool = Field(
        False, description=(
            "hide TP collectives behind the GEMMs they feed (Megatron-Core --tp-comm-overlap; "
            "needs sequence_parallel)"))
    # Beyond SCENARIO.md: Megatron-LM's asynchronous backward TP collectives (always on there).
    tp_backward_overlap: bool = Field(
        True, description=(
            "the column-parallel layers' backward TP collectives run beside their GEMMs "
            "(Megatron-LM's default); false: every TP collective waits (plain PyTorch, as "
            "the real-run harness)"))
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
    def sharded_gradients(self) -> bool:
        """Whether each rank keeps only its gradient shard, so that every micro-batch's
        gradients are reduce-scattered into it: ZeRO-3, and ZeRO-2 without a pipeline.

        With ``pp > 1`` ZeRO-2 keeps whole gradients like ZeRO-1 and reduce-scatters them once
        a step: PyTorch's pipelining turns FSDP's gradient sync off for every backward and
        reduces after the last one (``set_requires_gradient_sync(False)`` in
        ``backward_maybe_with_nosync``, then ``perform_reduce_grad``,
        torch/distributed/pipelining/stage.py), and DeepSpeed's pipeline engine refuses
        ZeRO-2 outright. ZeRO-3's per-unit model keeps its every-micro-batch reduce-scatters.
        """
        return self.zero == 3 or (self.zero == 2 and self.pp == 1)


SECTION_KEYS: dict[str, list[str]] = {
    "model": ["preset", "hf_config", *ModelSpec.model_fields],
    "training": list(TrainingSpec.model_fields),
    "parallel": list(ParallelSpec.model_fields),
}
