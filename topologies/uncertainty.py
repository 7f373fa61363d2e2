"""Profiles drawn from their own error bars (``Profile.uncertainty``).

Each uncertain figure of a profile — the GEMM ceiling, a tier's achieved bandwidth, ... — is
the median of a lognormal: a draw multiplies it by ``exp(sigma * z)``, ``z`` standard normal,
so it stays positive and ``sigma`` reads as a relative spread. Efficiencies are capped at 1.
The figures are drawn independently: a fit's residuals or a calibration's rounds say how far
each one may be off, not how they move together.
"""

from __future__ import annotations

import math
import random

from .profile import Profile


def sampled_profile(profile: Profile, rng: random.Random) -> Profile:
    """One draw of ``profile``: every figure it gives a spread for, scaled by its own factor."""
    if not profile.uncertainty:
        return profile
    factor = {name: math.exp(sigma * rng.gauss(0.0, 1.0))
              for name, sigma in sorted(profile.uncertainty.items())}
    update: dict = {}
    if "gemm.ceiling" in factor and profile.gemm is not None:
        ceiling = _capped(profile.gemm.ceiling * factor["gemm.ceiling"])
        update["gemm"] = profile.gemm.model_copy(update={"ceiling": ceiling})
    if "matmul_efficiency" in factor:
        update["matmul_efficiency"] = [(flops, _capped(eff * factor["matmul_efficiency"]))
                                       for flops, eff in profile.matmul_efficiency]
    for name in ("attention_efficiency", "memory_efficiency", "optimizer_efficiency"):
        value = getattr(profile, name)
        if name in factor and value is not None:
            update[name] = _capped(value * factor[name])
    if "attention_efficiency" in factor:  # one factor for every fused-attention figure
        update.update(_attention(profile, factor["attention_efficiency"]))
    tiers = {name.split(".", 1)[1]: f for name, f in factor.items()
             if name.startswith("comm_efficiency.")}
    if tiers:
        update["comm_efficiency"] = {
            tier: _capped(profile.comm_eff(tier) * tiers.get(tier, 1.0))
            for tier in {*profile.comm_efficiency, *tiers}}
    return profile.model_copy(update=update)


def _attention(profile: Profile, factor: float) -> dict:
    """The backward's fraction and each kernel family's, scaled as the forward's: a spread
    on ``attention_efficiency`` moves whichever family a scenario runs."""
    out: dict = {"attention_by_kernel": {
        family: (_capped(forward * factor), _capped(backward * factor))
        for family, (forward, backward) in profile.attention_by_kernel.items()}}
    if profile.attention_backward_efficiency is not None:
        out["attention_backward_efficiency"] = _capped(
            profile.attention_backward_efficiency * factor)
    return out


def _capped(efficiency: float) -> float:
    return min(efficiency, 1.0)
