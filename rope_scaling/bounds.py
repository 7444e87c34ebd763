"""The angle bounds of a scaled rope: how far every rotary pair stays inside the angles it saw.

:func:`reach` (the pre-training bound), :func:`finetune_bound` (the same after a fine-tune), and Liu et al. 2023's
closed form for a changed base (:func:`critical_dimension`, :func:`critical_period`). Plain math on inverse
frequencies (``rope_scaling.formulas.frequencies`` gives them for a spec); ``describe`` and the demo's tables read
them.
"""
from __future__ import annotations

import math
from typing import Sequence


def reach(orig_ctx: float, inv_freq: Sequence[float], scaled_inv_freq: Sequence[float]) -> float:
    """The pre-training angle bound: the longest context N in which every rotary pair stays inside the angles it saw
    in pre-training, N = orig_ctx * min(theta_i / theta'_i) over the pairs with orig_ctx * theta_i < 2*pi (wavelength
    longer than orig_ctx: they never completed a turn, so only [0, orig_ctx * theta_i] was seen; the others saw
    every angle and bound nothing); inf when no pair is bounded.

    A bound, not a prediction: a necessary condition for a training-free model to read every distance up to N with
    angles it knows (pair i at distance m turns m * theta'_i; inside the pre-training range while m * theta'_i <=
    orig_ctx * theta_i; positions treated as continuous). It counts angles only -- not attention temperature, not
    what a fine-tune teaches the model (:func:`finetune_bound` adds the angles a fine-tune saw). The bounded pairs
    are Liu et al. 2023's "critical dimensions for extrapolation" (arXiv 2310.05209); their closed form for a
    changed base is :func:`critical_period`, a different number (the critical pair's full turn, not its seen arc)."""
    return finetune_bound(orig_ctx, inv_freq, scaled_inv_freq, None)


def finetune_bound(orig_ctx: float, inv_freq: Sequence[float], scaled_inv_freq: Sequence[float],
                   trained_len: float | None) -> float:
    """The angle bound after a fine-tune on positions up to ``trained_len`` with the scaled frequencies: pair i has
    seen the angles [0, seen_i], seen_i = max(orig_ctx * theta_i, trained_len * theta'_i) (pre-training, then the
    fine-tune); a pair with seen_i >= 2*pi saw every angle and bounds nothing; the bound is min(seen_i / theta'_i)
    over the other pairs (inf when none). ``trained_len`` None (no fine-tune) gives :func:`reach`.

    Derived here as :func:`reach` is, from the angles alone: a fine-tune that trained at T_ft tokens
    lifts every pair's bound to at least T_ft, so a fine-tuned row's bound says what its training length allows."""
    if len(inv_freq) != len(scaled_inv_freq):
        raise ValueError("inv_freq and scaled_inv_freq must have the same length")
    out = math.inf
    for a, b in zip(inv_freq, scaled_inv_freq):
        if a == 0 or b == 0:  # a pair that does not rotate (proportional rope's unrotated part) bounds nothing
            continue
        seen = max(orig_ctx * a, (trained_len or 0) * b)
        if seen < 2 * math.pi:
            out = min(out, seen / b)
    return out


def critical_dimension(d: int, base: float, train_len: float) -> int:
    """d_extra = 2 * ceil((d/2) * log_base(T_train / (2*pi))), clamped to [0, d]: the dims whose pairs turned a full
    period in pre-training -- Liu et al. 2023 (arXiv 2310.05209), critical dimension for extrapolation (Lemma 1,
    Eq. 13 as the authors' README numbers it, OpenLMLab/scaling-rope)."""
    x = (d / 2) * math.log(train_len / (2 * math.pi)) / math.log(base)
    return min(max(2 * math.ceil(x), 0), d)


def critical_period(d: int, base: float, scaled_base: float, train_len: float) -> float:
    """T_extra = 2*pi * base'^(d_extra / d), the full period of the first critical pair under the new base base'
    (inf when every pair turned a full period) -- Liu et al. 2023 (arXiv 2310.05209), extrapolation upper bound for
    a larger base (Theorem 3, Eq. 16b as the authors' README numbers it, OpenLMLab/scaling-rope)."""
    de = critical_dimension(d, base, train_len)
    return math.inf if de >= d else 2 * math.pi * scaled_base ** (de / d)


def matched_base(orig_ctx: float, head_dim: int, base: float, target: float) -> float:
    """The RoPE base b' whose angle bound (:func:`reach`) is ``target``: b' = b * (T / L)^(d / (2 i0)), i0 the first
    bounded pair (the least i with L * b^(-2i/d) < 2*pi) -- solved from :func:`reach`: a new base rescales pair i by
    theta_i / theta'_i = (b'/b)^(2i/d), growing with i, so the first bounded pair binds, reach = L * (b'/b)^(2 i0/d).

    ABF matched to a scaled rope's bound (``target``: e.g. PI / YaRN x2's 2 * L). Raises ValueError when the target
    is below ``orig_ctx`` (a larger base never lowers the bound) or no pair is bounded (inf at any base)."""
    if target < orig_ctx:
        raise ValueError(f"target {target:g} below the original context {orig_ctx:g}: no base lowers the bound")
    i0 = next((i for i in range(head_dim // 2) if orig_ctx * base ** (-(2 * i) / head_dim) < 2 * math.pi), None)
    if i0 is None:
        raise ValueError("no rotary pair is bounded: the angle bound is infinite at any base")
    if i0 == 0:  # pair 0 never rotates faster or slower with the base: the bound stays orig_ctx
        if target != orig_ctx:
            raise ValueError("the first pair is bounded: no base moves the bound off the original context")
        return float(base)
    return float(base) * (target / orig_ctx) ** (head_dim / (2 * i0))
