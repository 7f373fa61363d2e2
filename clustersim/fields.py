"""Numeric field types shared by the specs: finite, within physical reach, never booleans.

Every number a scenario, catalogue or profile holds goes through one of these types, so one
place decides what a number may be (docs/scenario.md, "Numbers"):

- never a boolean: pydantic's lax mode reads ``True`` as 1, and ``tp: yes`` is a mistake;
- never ``inf`` or ``nan`` (``1e400`` reads as ``inf``): a non-finite input gives a
  non-finite answer ("inf days", ``Infinity`` in JSON), which is no answer;
- never beyond any physical meaning: counts at most ``MAX_COUNT`` (layers ``MAX_LAYERS``),
  tokens at most ``MAX_TOKENS``, other quantities between ``MIN_QUANTITY`` and
  ``MAX_QUANTITY``. Inside these bounds every product and quotient the model forms stays far
  from float64's range (about 1e308), so a finite input gives a finite result.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

# Counts of things in one training job (heads, widths, vocabulary, sequence length,
# experts, GPUs, sequences per batch, parallel degrees). 2**24 = 16,777,216 is 16x the largest
# real value of any of them: a million experts (PEER, He 2024, arXiv 2407.04202: 1024**2), a
# 10M-token context (Llama 4 Scout, Meta 2025), 100k-GPU clusters, BERT's 64k-sequence batch
# (You et al. 2019, arXiv 1904.00962). global_batch: 1e18 gave a 1.3e16 s step (issue 24).
MAX_COUNT = 2**24
# Transformer layers: 10,000 is 10x the deepest transformer trained, DeepNet's 1,000 layers
# (Wang et al. 2022, arXiv 2203.00555); production models run 32-126 (Llama 3.1 405B: 126).
# The simulator steps through every layer (compute and DP/ZeRO traffic overlap layer by
# layer), so its run time grows with them: on a loaded 2-core machine Mixtral 8x7B with 10,000
# layers simulates in 14 s at representative fidelity and with 100,000 in 100 s; 10**6 (a
# value the fuzz tries) would run for over 20 minutes, 2**24 for hours.
MAX_LAYERS = 10_000
# Tokens to train on. 1e16 is about 30x the whole stock of public human-written text,
# ~3e14 tokens (Villalobos et al. 2024, arXiv 2211.04325), and 250x the largest published run
# (Qwen3: 36e12 tokens, arXiv 2505.09388).
MAX_TOKENS = 1e16
# Any other quantity in clustersim's units (FLOP/s, GB/s, seconds, bytes, ratios). The fastest
# GPU in the catalogue peaks at 5e15 FLOP/s (GB200 fp8, topologies/gpus.yaml), so 1e18 is 200x
# past every real rate or size; 1e-18 GB/s is one byte in 30 years.
MAX_QUANTITY = 1e18
MIN_QUANTITY = 1e-18
# Bytes of one device's memory: 2**53 (8 PiB) is where float64 stops counting bytes exactly,
# 30,000x the largest HBM in the catalogue (~2e11 bytes).
MAX_BYTES = 2**53

# Why each bound exists, added to pydantic's "less than or equal to ..." (clustersim.errors).
LIMIT_REASONS = {
    MAX_COUNT: "beyond any real training job",
    MAX_LAYERS: "10 times the deepest transformer trained",
    MAX_TOKENS: "beyond all the text there is",
    MAX_QUANTITY: "beyond any physical meaning",
    MAX_BYTES: "beyond any device's memory",
}


def no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def not_vanishing(value: float) -> float:
    """A positive quantity no smaller than ``MIN_QUANTITY`` (zero and below are refused by
    the type's ``gt=0`` first, with pydantic's message)."""
    if value < MIN_QUANTITY:
        raise ValueError(f"must be at least {MIN_QUANTITY:g}, below any physical meaning")
    return value


_NUMBER = BeforeValidator(no_bool)
_FINITE = Field(allow_inf_nan=False)  # ints refuse inf and nan by themselves
_NOT_VANISHING = AfterValidator(not_vanishing)

PositiveInt = Annotated[int, _NUMBER, Field(gt=0, le=MAX_COUNT)]
LayerCount = Annotated[int, _NUMBER, Field(gt=0, le=MAX_LAYERS)]
NonNegativeInt = Annotated[int, _NUMBER, Field(ge=0, le=MAX_COUNT)]
ByteCount = Annotated[int, _NUMBER, Field(gt=0, le=MAX_BYTES)]
Bytes = Annotated[int, _NUMBER, Field(ge=0, le=MAX_BYTES)]  # a size that may be zero
PositiveFloat = Annotated[float, _NUMBER, _FINITE, Field(gt=0, le=MAX_QUANTITY), _NOT_VANISHING]
NonNegativeFloat = Annotated[float, _NUMBER, _FINITE, Field(ge=0, le=MAX_QUANTITY)]
Tokens = Annotated[float, _NUMBER, _FINITE, Field(ge=0, le=MAX_TOKENS)]
Fraction = Annotated[float, _NUMBER, _FINITE, Field(gt=0, le=1), _NOT_VANISHING]
Probability = Annotated[float, _NUMBER, _FINITE, Field(ge=0, lt=1)]  # 1 would be certainty
AtLeastOne = Annotated[float, _NUMBER, _FINITE, Field(ge=1, le=MAX_QUANTITY)]  # ratios, factors
