"""The RoPE formulas: one pure function per method, one registry (like transformers' ``ROPE_INIT_FUNCTIONS``).

Every function takes the rotary dimension ``d`` (head_dim), the base (after any ABF step), the :class:`RopeSpec`
and the current sequence length, and returns :class:`Freqs` -- the ``d/2`` inverse frequencies in float64, the
attention factor that multiplies cos/sin, and the effective base. No torch, no transformers: plain math, so
``describe``, the HF adapter and the tests' expectations can all be checked against it.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .spec import RopeSpec


class Freqs(NamedTuple):
    inv_freq: list[float]  # d/2 values, pair i rotates by inv_freq[i] radians per token
    attention_factor: float  # multiplies cos and sin (1.0 = none)
    base: float  # the effective base (for ntk / dynamic_ntk the rescaled one)


def rope_inv_freq(d: int, base: float) -> list[float]:
    """theta_i = base^(-2i/d), i = 0..d/2-1 -- RoFormer, Su et al. 2021 (arXiv 2104.09864), Sec 3.2.2."""
    return [base ** (-(2 * i) / d) for i in range(d // 2)]


def ntk_base(base: float, d: int, s: float) -> float:
    """b' = b * s^(d/(d-2)) -- NTK-aware RoPE (bloc97, r/LocalLLaMA 2023); YaRN arXiv 2309.00071 Sec 3.1."""
    return base * s ** (d / (d - 2))


def dynamic_ntk_base(base: float, d: int, s: float, seq_len: int, orig_ctx: int) -> float:
    """b' = b * (s*L/L_orig - (s-1))^(d/(d-2)) for L > L_orig -- Dynamic NTK, YaRN 2309.00071 Sec 3.3."""
    L = max(seq_len, orig_ctx)
    return base * ((s * L / orig_ctx) - (s - 1)) ** (d / (d - 2))


def yarn_correction_range(d: int, base: float, orig_ctx: int, beta_fast: float, beta_slow: float) -> tuple[int, int]:
    """Ramp ends floor(i(beta_fast)), ceil(i(beta_slow)); i(r) = d*ln(L/(2*pi*r))/(2*ln b) -- YaRN Sec 3.2."""
    def dim(rot: float) -> float:
        return d * math.log(orig_ctx / (rot * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), d - 1)


def yarn_attention_factor(s: float) -> float:
    """sqrt(1/t) = 0.1 * ln(s) + 1 (1 for s <= 1) -- YaRN arXiv 2309.00071 Sec 3.4."""
    return 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0


# ---------------------------------------------------------------- one function per method
def _none(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Plain RoPE -- RoFormer arXiv 2104.09864, Sec 3.2.2."""
    return Freqs(rope_inv_freq(d, base), 1.0, base)


def _pi(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Position Interpolation: f(x, m/s), i.e. theta_i / s -- Chen et al. 2023 (arXiv 2306.15595), Sec 2.2."""
    return Freqs([f / spec.scale for f in rope_inv_freq(d, base)], 1.0, base)


def _ntk(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Static NTK-aware: RoPE with b' = b * s^(d/(d-2)) -- bloc97 (r/LocalLLaMA 2023); YaRN arXiv 2309.00071 Sec 3.1."""
    b = ntk_base(base, d, spec.scale)
    return Freqs(rope_inv_freq(d, b), 1.0, b)


def _dynamic_ntk(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Dynamic NTK: the NTK base recomputed from the current length L -- YaRN arXiv 2309.00071 Sec 3.3."""
    b = dynamic_ntk_base(base, d, spec.scale, seq_len or spec.orig_ctx, spec.orig_ctx)
    return Freqs(rope_inv_freq(d, b), 1.0, b)


def _yarn(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """NTK-by-parts (linear ramp between the correction dims) + attention 0.1*ln(s)+1 -- YaRN 2309.00071 Sec 3.2-3.4."""
    low, high = yarn_correction_range(d, base, spec.orig_ctx, spec.yarn_beta, spec.yarn_alpha)
    if high == low:
        high += 0.001  # as the reference implementation: avoid a zero-width ramp
    out = []
    for i, f in enumerate(rope_inv_freq(d, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep (extrapolate), 1: divide by s
        out.append(f / spec.scale * ramp + f * (1 - ramp))
    att = spec.yarn_mscale if spec.yarn_mscale is not None else yarn_attention_factor(spec.scale)
    return Freqs(out, att, base)


def _abf(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Adjusted Base Frequency: RoPE with a new base -- Xiong et al. 2023 (arXiv 2309.16039); CodeLlama Sec 2.4."""
    return Freqs(rope_inv_freq(d, base), 1.0, base)


def _llama3(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Llama 3.1 scaling: keep wavelen < L/high, divide > L/low by s, blend between -- Meta llama3 ``apply_scaling``."""
    L, lo, hi = spec.orig_ctx, spec.llama3_low, spec.llama3_high
    out = []
    for f in rope_inv_freq(d, base):
        wavelen = 2 * math.pi / f
        if wavelen < L / hi:
            out.append(f)
        elif wavelen > L / lo:
            out.append(f / spec.scale)
        else:
            smooth = (L / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / spec.scale + smooth * f)
    return Freqs(out, 1.0, base)


FORMULAS: dict[str, Callable[[int, float, RopeSpec, int | None], Freqs]] = {
    "none": _none,
    "pi": _pi,
    "ntk": _ntk,
    "dynamic_ntk": _dynamic_ntk,
    "yarn": _yarn,
    "abf": _abf,
    "llama3": _llama3,
}


def frequencies(spec: RopeSpec, head_dim: int, base: float, seq_len: int | None = None) -> Freqs:
    """The rope a spec implies for a model with ``head_dim`` and original ``base``: ABF first (``rope_base``
    replaces the base), then the method. ``seq_len`` matters only for dynamic_ntk (default: the original context)."""
    if spec.orig_ctx is None and spec.method in ("dynamic_ntk", "yarn", "llama3"):
        raise ValueError(f"{spec.method} needs orig_ctx")
    b = spec.rope_base if spec.rope_base is not None else base
    return FORMULAS[spec.method](head_dim, float(b), spec, seq_len)
