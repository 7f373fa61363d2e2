"""Validated specs of one scenario: model shape, training settings and parallel split.

Each section is a frozen pydantic model that refuses unknown keys, negative sizes and
booleans where numbers belong; rules that span sections live in ``scenario.py``.
Units follow SCENARIO.md: batch sizes in sequences.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator, model_validator

from clustersim.fields import NonNegativeFloat, PositiveInt, no_bool

from .placement import DEFAULT_ORDER, parse_order

FfnKind = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "none"]
Precision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adam", "sgd"]
ScheduleName = Literal["gpipe", "1f1b", "interleaved"]
Recompute = Literal["none", "selective", "full"]
ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(no_bool)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Section):
    """A decoder-only transformer (dense, or MoE when ``experts > 1``)."""

    name: str = "custom"
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = None  # None: as many as heads (MHA)
    ffn_hidden: PositiveInt | None = None  # None: 4 * hidden
    ffn_kind: FfnKind = "gelu"
    vocab: PositiveInt
    seq_len: PositiveInt
    experts: PositiveInt = 1
    top_k: PositiveInt = 1
    # Beyond SCENARIO.md's list; defaults are GPT-2/3 and Megatron-LM's.
    norm: Norm = "layernorm"  # layernorm: weight + bias; rmsnorm: weight only
    bias: bool = True  # linear layers carry biases
    position_embedding: PositionEmbedding = "learned"
    tie_embeddings: bool = True  # output layer shares the input embedding's weights

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
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one MLP: 2 for gelu, 3 for swiglu (gate, up, down)."""
        return 3 if self.ffn_kind == "swiglu" else 2


class TrainingSpec(_Section):
    """Batch sizes, numeric precision and optimizer of one optimizer step."""

    global_batch: PositiveInt
    micro_batch: PositiveInt = 1
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"
    tokens: NonNegativeFloat | None = None
    flash_attention: bool = True  # fused attention keeps no s x s score matrices


class ParallelSpec(_Section):
    """How the model and batch are split over GPUs; ``dp=None`` is derived by the scenario."""

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: PositiveInt | None = None
    cp: PositiveInt = 1
    ep: PositiveInt = 1
    schedule: ScheduleName = "1f1b"
    virtual_stages: PositiveInt = 1
    stage_layers: list[PositiveInt] | None = None
    zero: ZeroStage = 0
    sequence_parallel: bool = False
    recompute: Recompute = "none"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # Beyond SCENARIO.md: hide TP collectives behind the GEMMs they feed (Megatron-Core's
    # --tp-comm-overlap, which needs sequence parallelism).
    tp_comm_overlap: bool = False
    # Beyond SCENARIO.md: rank numbering, innermost dimension first (Megatron-LM's default).
    order: str = DEFAULT_ORDER

    @field_validator("order")
    @classmethod
    def _known_order(cls, order: str) -> str:
        parse_order(order)
        return order

    @model_validator(mode="after")
    def _schedule_rules(self) -> ParallelSpec:
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError(
                f"virtual_stages > 1 needs schedule 'interleaved' (got {self.schedule!r})")
        return self

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans, without data parallelism: ``tp * pp * cp``."""
        return self.tp * self.pp * self.cp


SECTION_KEYS: dict[str, list[str]] = {
    "model": ["preset", "hf_config", *ModelSpec.model_fields],
    "training": list(TrainingSpec.model_fields),
    "parallel": list(ParallelSpec.model_fields),
}
