"""Validated specs of one scenario: model shape and training settings (the parallel split is
``parallel_spec.py``).

Each section is a frozen pydantic model that refuses unknown keys, negative sizes and
booleans where numbers belong; rules that span sections live in ``scenario.py``.
Units follow SCENARIO.md: batch sizes in sequences.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustersim.fields import (
    AtLeastOne,
    LayerCount,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    Tokens,
)

from .parallel_spec import ParallelSpec
from .spec_base import (
    FfnKind,
    Framework,
    GradPrecision,
    MasterWeights,
    MomentsDtype,
    Norm,
    Optimizer,
    OptimizerImpl,
    PositionEmbedding,
    Precision,
    _Section,
)


class ModelSpec(_Section):
    """A decoder-only transformer (dense, or MoE when ``experts > 1``)."""

    name: str = Field(
        "custom", description="label in reports (a preset's or imported config's name)")
    layers: LayerCount = Field(description="transformer layers")
    hidden: PositiveInt = Field(description="hidden size h")
    heads: PositiveInt = Field(description="attention heads a")
    # Beyond SCENARIO.md: a head width of its own (HF config.json's head_dim), as Qwen3 and
    # Gemma set it, so that heads x head_dim may differ from hidden.
    head_dim: PositiveInt | None = Field(
        None, description=("per-head width of queries, keys and values; null: hidden / heads. "
                           "Qwen3 and Gemma set their own (Qwen3-30B-A3B: 32 heads of 128 over "
                           "a hidden size of 2048)"))
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
    # Group-limited routing (DeepSeek-V2 report arXiv 2405.04434 sec. 2.2.2, DeepSeek-V3 report
    # arXiv 2412.19437 sec. 2.1.2; the HF configs' n_group, topk_group): the experts are split
    # into groups and each token's top_k come from its best expert_groups_per_token groups.
    expert_groups: PositiveInt | None = Field(
        None, description=("MoE: groups the experts are split into for group-limited "
                           "routing (HF n_group; DeepSeek-V3: 8); null: none"))
    expert_groups_per_token: PositiveInt | None = Field(
        None, description=("MoE: groups a token's top_k experts may come from (HF topk_group; "
                           "DeepSeek-V3: 4, so a token reaches at most 4 nodes of 8)"))
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
    # DeepSeek-V3's multi-token prediction (arXiv 2412.19437 sec. 2.2; Megatron-Core's
    # --mtp-num-layers, HF num_nextn_predict_layers): trained beside the model, in its last chunk.
    mtp_layers: NonNegativeInt = Field(
        0, description=("multi-token prediction modules after the last layer, each a projection "
                        "of 2 hidden to hidden, one more layer like the model's last and the "
                        "shared output layer and loss again, run in the last pipeline chunk "
                        "(DeepSeek-V3: 1; HF num_nextn_predict_layers; Megatron-Core's "
                        "--mtp-num-layers); not in the model's parameter count or MFU"))
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
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        self._deepseek_moe_rules()
        self._latent_attention_rules()
        return self

    def _group_rules(self) -> None:
        groups, per_token = self.expert_groups, self.expert_groups_per_token
        if (groups is None) != (per_token is None):
            raise ValueError("expert_groups and expert_groups_per_token go together")
        if groups is None:
            return
        if self.experts % groups:
            raise ValueError(f"expert_groups ({groups}) must divide experts ({self.experts})")
        if per_token > groups or self.top_k > per_token * self.experts // groups:
            raise ValueError(f"expert_groups_per_token ({per_token}) must be at most "
                             f"expert_groups ({groups}) and hold top_k ({self.top_k}) experts")

    def _deepseek_moe_rules(self) -> None:
        self._group_rules()
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
        if self.head_dim is not None:
            raise ValueError("head_dim is not a latent-attention field: MLA's head widths are "
                             "qk_nope_head_dim, qk_rope_head_dim and v_head_dim")

    @property
    def head_width(self) -> int:
        """Per-head width of queries, keys and values: ``head_dim``, or ``hidden / heads``."""
        return self.head_dim or self.hidden // self.heads

    @property
    def query_width(self) -> int:
        """Width of the Q projection and of the attention's output, the output projection's
        input: ``heads * head_width`` (``hidden`` unless ``head_dim`` says otherwise)."""
        return self.heads * self.head_width

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: ``kv_heads * head_width``."""
        return self.kv_heads * self.head_width

    def kv_width_per_rank(self, tp: int) -> float:
        """Width of the K (or V) projection on one of ``tp`` ranks: the kv heads split by tp
        down to one head each, below which they are replicated (Megatron-LM's
        ``num_query_groups`` < tp case, megatron/core/transformer/attention.py)."""
        return max(self.kv_heads / tp, 1) * self.head_width

    @property
    def mla(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys: ``qk_nope + qk_rope`` under MLA, else
        ``head_width``."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_width

    @property
    def value_head_dim(self) -> int:
        """Per-head width of values (and of the attention output): ``v_head_dim`` or
        ``head_width``."""
        return self.v_head_dim if self.mla else self.head_width

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
            "dense_ffn_hidden": None, "capacity_factor": 1.0, "expert_imbalance": 1.0,
            "expert_groups": None, "expert_groups_per_token": None, "mtp_layers": 0})

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
    autocast: bool = Field(
        False, description=(
            "bf16/fp16 as PyTorch autocast runs it over fp32 parameters (plain PyTorch AMP, "
            "Hugging Face's Trainer, clustersim's harness; pair it with master_weights: "
            "params): the GEMMs cast their operands, the residual stream, norms and loss stay "
            "fp32, so each layer keeps its norms' inputs in fp32 and the loss its logits twice"))
    optimizer_impl: OptimizerImpl | None = Field(
        None, description=(
            "how the optimizer step runs: fused (a multi-tensor kernel updating in place: "
            "Transformer Engine's and Apex's FusedAdam, DeepSpeed's, torch's fused=True) or "
            "foreach (torch.optim's default on GPUs: Adam takes the square root of every "
            "second moment at once, an fp32 temporary as large as one moment, alive in the "
            "step); null: the framework's (fused for all three)"))
    tokens: Tokens | None = Field(
        None, description="tokens to train on; gives time_to_train_s")
    flash_attention: bool = Field(
        True, description="fused attention: no s x s score matrices are kept for backward")
    framework: Framework = Field(
        "megatron", description=(
            "the training stack whose defaults fill the fields left out: gradient dtype, "
            "where the master weights live, ZeRO stage, reduction and gather overlap "
            "(docs/frameworks.md); fields given explicitly override it"))
    attention_kernel: Literal["flash1", "flash2", "flash3", "triton"] | None = Field(
        None, description=(
            "fused attention kernels: flash1 (FlashAttention, flash-attn 1.x), flash2 "
            "(FlashAttention-2, also PyTorch SDPA's flash backend), flash3 (Hopper's "
            "FlashAttention-3 class: FA3, or cuDNN's fused attention that Transformer Engine "
            "picks on H100) or triton (FlashAttention in Triton, the 2022-23 kernel of "
            "llm-foundry's `attn_impl: triton`); a GPU without figures for the family runs "
            "flash2's; null: the framework's, and where that is null (Megatron-LM's) the GPU's "
            "own, its profile's default: flash3 on Hopper and later, flash2 before"))
    loss_kernel: Literal["vocab_parallel", "pytorch", "fused"] | None = Field(
        None, description=(
            "the cross-entropy's implementation, which decides what the loss keeps and what "
            "its backward allocates: vocab_parallel (Megatron-LM's vocab-parallel "
            "cross-entropy on an fp32 copy of the logits, softmax and its gradient in place), "
            "pytorch (F.cross_entropy on logits cast to fp32, as torchtitan: its backward "
            "holds two fp32 gradients beside the saved log-probabilities), fused "
            "(flash-attn's Triton cross-entropy, llm-foundry's fused_crossentropy: keeps the "
            "logits as they are); null: the framework's"))
    grad_accumulation_fusion: bool | None = Field(
        None, description=(
            "the weight-gradient GEMM adds into the gradient buffer itself (Megatron-LM's "
            "--gradient-accumulation-fusion); false: each micro-batch's gradients are added in "
            "a kernel of their own, reading and writing the buffer (autograd's AccumulateGrad: "
            "DeepSpeed, FSDP, plain PyTorch); null: the framework's"))
    fp8_param_gather: bool = Field(
        False, description=(
            "under fp8, keep the layers' weights as FP8 parameters (Megatron-LM's "
            "--fp8-param-gather, Transformer Engine's fp8_model_init): no bf16 copy beside "
            "them, and the distributed optimizer gathers them in FP8; needs zero >= 1"))
    master_weights: MasterWeights | None = Field(
        None, description=(
            "where the fp32 master copy lives under bf16/fp16/fp8: optimizer (beside the "
            "training-precision weights, in the optimizer state: Megatron-LM, DeepSpeed), "
            "params (the parameters are fp32 and are the master, cast per use: FSDP; under "
            "ZeRO-3 a shard is 4 + 4 + 8 bytes per parameter), remainders (the optimizer "
            "keeps only the 16 bits of each fp32 master that the bf16 weight lacks, 2 bytes: "
            "apex's DistributedFusedAdam as NeMo ran it, Megatron-LM's precision-aware "
            "optimizer) or none (the optimizer updates the training-precision weights "
            "themselves: DistributedFusedAdam with its dtype set to the model's); null: the "
            "framework's"))
    optimizer_moments: MomentsDtype = Field(
        "fp32", description=(
            "what the optimizer's moments are stored in (Adam's two, SGD's one): fp32, or "
            "bf16 as DeepSeek-V3 trained (its report, sec. 3.3.3), Megatron-LM's "
            "--exp-avg-dtype/--exp-avg-sq-dtype, apex DistributedFusedAdam's dtype"))


SECTION_KEYS: dict[str, list[str]] = {
    "model": ["preset", "hf_config", *ModelSpec.model_fields],
    "training": list(TrainingSpec.model_fields),
    "parallel": list(ParallelSpec.model_fields),
}
