"""The RoPE methods: one entry per method in one registry (like transformers' ``ROPE_INIT_FUNCTIONS``).

A method is a :class:`Method` row, and the row is the whole method: its formula (rotary dimension ``d`` (head_dim), the
base after any ABF step, the :class:`~rope_scaling.spec.RopeSpec` and the current sequence length -> :class:`Freqs`:
the ``d/2`` inverse frequencies in float64, the attention factor that multiplies cos/sin, and the effective base), how
it is written as plain Hugging Face rope entries and read back from them, what its settings must satisfy (alone, and
against a model's rotary dim), the spec fields that belong to it, its runtime rule (frequencies recomputed in every
forward), what ``describe`` adds for it and the one line ``describe --help`` shows of it. How vLLM serves the HF
entries a row writes is the vllm backend's (``ropescale.evaluation.backends.vllm``, keyed by their rope type). No code
outside this registry branches on a method's name: it asks the row.

Beside the methods: the per-pair rescale factors theta_i / theta'_i a spec implies (:func:`rescale_factors`, the
LongRoPE search's start). The angle bounds of a scaled rope are ``rope_scaling.bounds``.

A new method is its functions and one :data:`REGISTRY` entry here (docs/extending.md): ``RopeSpec`` takes its name,
``--rope`` offers it, ``hf.apply_rope`` writes it, ``describe`` explains it, a serving backend serves or refuses the
HF type it writes, and ``tests/test_rope_registry.py`` covers it on arrival. No torch, no transformers: plain math and
dicts, so ``describe``, the HF adapter and the tests' expectations can all be checked against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ropescale.common.io import InputError

RopeSpec = Any  # a rope_scaling.spec.RopeSpec: the formulas read its fields; spec.py imports this module, not back


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


def dynamic_ntk_scale(s: float, seq_len: int, orig_ctx: int) -> float:
    """s_eff = s*L/L_orig - (s-1), L >= L_orig: the NTK scale dynamic NTK runs at L -- transformers
    ``_compute_dynamic_ntk_parameters`` (its base is :func:`ntk_base` at s_eff; 3 at 16K for s = 2, L_orig = 8K)."""
    return s * max(seq_len, orig_ctx) / orig_ctx - (s - 1)


def yarn_correction_range(d: int, base: float, orig_ctx: int, beta_fast: float, beta_slow: float,
                          truncate: bool = True) -> tuple[float, float]:
    """Ramp ends i(beta_fast), i(beta_slow), i(r) = d*ln(L/(2*pi*r))/(2*ln b), floored / ceiled to whole pairs unless
    ``truncate`` is False (gpt-oss), clamped to [0, d-1] -- YaRN Sec 3.2; transformers ``_compute_yarn_parameters``."""
    def dim(rot: float) -> float:
        return d * math.log(orig_ctx / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim(beta_fast), dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def yarn_attention_factor(s: float, mscale: float = 1.0) -> float:
    """sqrt(1/t) = 0.1 * m * ln(s) + 1 (1 for s <= 1; m = 1 in the paper) -- YaRN arXiv 2309.00071 Sec 3.4;
    DeepSeek-V3's ``yarn_get_mscale(scale, mscale)``."""
    return 1.0 if s <= 1 else 0.1 * mscale * math.log(s) + 1.0


def yarn_full_attention_factor(spec: RopeSpec, s: float) -> float:
    """The attention factor of a YaRN spec at scale s: --yarn-mscale when set, else DeepSeek's ratio
    mscale(s, c) / mscale(s, c') when both coefficients are set (nonzero), else 0.1 ln(s) + 1 -- transformers
    ``_compute_yarn_parameters`` (DeepSeek-V3 / Kimi-K2 configs)."""
    if spec.yarn_mscale is not None:
        return spec.yarn_mscale
    c, c_all = spec.yarn_mscale_coef, spec.yarn_mscale_all_dim
    if c and c_all:
        return yarn_attention_factor(s, c) / yarn_attention_factor(s, c_all)
    return yarn_attention_factor(s)


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
    return Freqs(yarn_inv_freq(d, base, spec.scale, spec.orig_ctx, spec.yarn_alpha, spec.yarn_beta, spec.yarn_truncate),
                 yarn_full_attention_factor(spec, spec.scale), base)


def yarn_inv_freq(d: int, base: float, s: float, orig_ctx: int, alpha: float, beta: float,
                  truncate: bool = True) -> list[float]:
    """theta_i/s * ramp_i + theta_i * (1 - ramp_i), the ramp linear in i between the correction dims -- YaRN arXiv
    2309.00071 Sec 3.2 (NTK-by-parts), as its reference code (jquesnelle/yarn) and transformers compute it."""
    low, high = yarn_correction_range(d, base, orig_ctx, beta, alpha, truncate)
    if high == low:
        high += 0.001  # as the reference implementation: avoid a zero-width ramp
    out = []
    for i, f in enumerate(rope_inv_freq(d, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep (extrapolate), 1: divide by s
        out.append(f / s * ramp + f * (1 - ramp))
    return out


def _dynamic_yarn(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """YaRN at s = max(1, L / L_orig) for the current length L -- YaRN arXiv 2309.00071 Sec 3.3 (dynamic scaling)
    + 3.2-3.4; jquesnelle/yarn ``LlamaDynamicYaRNScaledRotaryEmbedding``.

    ``--scale`` is the extension the setting is meant for (the extended context orig x s), not a floor: at L <=
    orig this is plain RoPE. Written into a config as the static ``yarn`` entry at factor s (HF has no dynamic
    YaRN), which is what plain transformers (any reader of HF entries) then runs: the same frequencies at the
    extended context, YaRN x s (not the dynamic ones) below it; this repo reads the ``ropescale_rope`` record back as
    dynamic_yarn and must recompute the frequencies per forward from the current length (its own rotary hook:
    ``Method.per_forward``)."""
    s = _dynamic_yarn_scale(spec, spec.orig_ctx, seq_len)
    return Freqs(yarn_inv_freq(d, base, s, spec.orig_ctx, spec.yarn_alpha, spec.yarn_beta), yarn_attention_factor(s),
                 base)


def _dynamic_yarn_scale(spec: RopeSpec, orig_ctx: int, seq_len: int | None) -> float:
    """Dynamic YaRN's s at the current length L: max(1, L / L_orig) -- YaRN arXiv 2309.00071 Sec 3.3."""
    return max(1.0, (seq_len or orig_ctx) / orig_ctx)


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


def longrope_attention_factor(s: float, orig_ctx: int) -> float:
    """sqrt(1 + ln(s) / ln(L_orig)) (1 for s <= 1) -- LongRoPE's default magnitude scaling ("su", microsoft/LongRoPE
    rope/longrope.py; Phi-3), transformers' longrope default."""
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(orig_ctx))


def _longrope(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """theta_i / lambda_i with per-pair rescale factors lambda_i: long_factor past the original context, short_factor
    within it -- LongRoPE arXiv 2402.13753 Sec 3.1-3.2; transformers ``longrope`` (Phi-3)."""
    f = spec.longrope_factors
    lam = f.long_factor if seq_len is not None and seq_len > spec.orig_ctx else f.short_factor
    if len(lam) != d // 2:
        raise ValueError(f"longrope factors have {len(lam)} values, rotary dim {d} needs {d // 2}")
    att = f.attention_factor if f.attention_factor is not None else longrope_attention_factor(spec.scale,
                                                                                               spec.orig_ctx)
    return Freqs([t / x for t, x in zip(rope_inv_freq(d, base), lam)], att, base)


def _proportional(d: int, base: float, spec: RopeSpec, seq_len: int | None) -> Freqs:
    """Proportional (partial) RoPE over the whole head: the first int(p * d / 2) pairs at base^(-2i/d) / s, the
    others 0 (not rotated) -- transformers ``_compute_proportional_rope_parameters`` (Gemma 4's partial RoPE)."""
    n = int(spec.rope_proportion * d // 2)
    return Freqs([base ** (-(2 * i) / d) / spec.scale if i < n else 0.0 for i in range(d // 2)], 1.0, base)


# ---------------------------------------------------------------- how each method is written into an HF config
# (entries, max_position_embeddings) for a resolved spec (orig_ctx set) on a model with base ``b`` (after ABF) and
# rotary dim ``d``; transformers reads every one of these without this repo.
def _default_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    return {"rope_type": "default", "rope_theta": b}, _extended(spec)


def _ntk_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    return {"rope_type": "default", "rope_theta": ntk_base(b, d, spec.scale)}, _extended(spec)


def _pi_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    return {"rope_type": "linear", "rope_theta": b, "factor": spec.scale}, _extended(spec)


def _dynamic_ntk_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    # HF's dynamic type reads max_position_embeddings as the original context, so it stays orig
    return {"rope_type": "dynamic", "rope_theta": b, "factor": spec.scale}, spec.orig_ctx


def _yarn_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    e = {"rope_type": "yarn", "rope_theta": b, "factor": spec.scale, "original_max_position_embeddings": spec.orig_ctx,
         "beta_fast": spec.yarn_beta, "beta_slow": spec.yarn_alpha}
    if spec.yarn_mscale is not None:
        e["attention_factor"] = spec.yarn_mscale  # transformers: the factor itself
        e["attn_factor"] = spec.yarn_mscale / yarn_attention_factor(spec.scale)  # vLLM: a multiplier on 0.1*ln(s)+1
    for k, v in (("mscale", spec.yarn_mscale_coef), ("mscale_all_dim", spec.yarn_mscale_all_dim)):
        if v is not None:
            e[k] = v  # DeepSeek's coefficients, transformers computes the factor from them
    if not spec.yarn_truncate:
        e["truncate"] = False
    return e, _extended(spec)


def _llama3_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    return {"rope_type": "llama3", "rope_theta": b, "factor": spec.scale, "original_max_position_embeddings":
            spec.orig_ctx, "low_freq_factor": spec.llama3_low, "high_freq_factor": spec.llama3_high}, _extended(spec)


def _dynamic_yarn_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    # HF has no dynamic YaRN: a reader of HF entries runs static YaRN at the full factor (equal at orig x s); this
    # repo reads its ropescale_rope record back as dynamic_yarn
    return {"rope_type": "yarn", "rope_theta": b, "factor": spec.scale, "original_max_position_embeddings":
            spec.orig_ctx, "beta_fast": spec.yarn_beta, "beta_slow": spec.yarn_alpha}, _extended(spec)


def _longrope_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    f = spec.longrope_factors
    e = {"rope_type": "longrope", "rope_theta": b, "factor": spec.scale, "original_max_position_embeddings":
         spec.orig_ctx, "short_factor": list(f.short_factor), "long_factor": list(f.long_factor)}
    if f.attention_factor is not None:
        e["attention_factor"] = f.attention_factor
    return e, _extended(spec)


def _proportional_hf(spec: RopeSpec, b: float, d: int) -> tuple[dict, int]:
    return {"rope_type": "proportional", "rope_theta": b, "factor": spec.scale, "partial_rotary_factor":
            spec.rope_proportion}, _extended(spec)


def _extended(spec: RopeSpec) -> int:
    return int(round(spec.orig_ctx * spec.scale))


# ---------------------------------------------------------------- each HF rope type read back as a method
# For a config this repo did not write (a model's native scaling, a config edited by hand): the flat entries ``e``
# (rope_type, rope_theta, factor ...), the config's original_max_position_embeddings ``orig`` (None when it names
# none) and its max_position_embeddings ``max_pos`` -> the spec's fields. ntk and abf write "default" too, but a
# default entry alone cannot tell them from a model's own base: it reads back as none.
def _factor(e: dict) -> float:
    """The entries' factor (InputError when a type that needs one names none)."""
    if e.get("factor") is None:
        raise InputError(f"rope type {e['rope_type']!r} without a factor")
    return e["factor"]


def _none_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    return {"method": "none", "orig_ctx": max_pos}


def _pi_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    # linear entries do not say the original context: max_position_embeddings is taken as it (Vicuna-v1.5-16K's
    # style: 4096 with factor 4); what this repo writes (orig x s) carries it in its ropescale_rope record
    return {"method": "pi", "scale": _factor(e), "orig_ctx": orig or max_pos}


def _dynamic_ntk_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    # transformers' dynamic NTK takes max_position_embeddings as the original context
    return {"method": "dynamic_ntk", "scale": _factor(e), "orig_ctx": max_pos}


def _yarn_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    # transformers: no factor means max_position_embeddings / original (DeepSeek-V3's note); mscale / mscale_all_dim
    # (DeepSeek, Kimi-K2) and truncate (gpt-oss) as _compute_yarn_parameters reads them
    if e.get("factor") is None and orig:
        e = {**e, "factor": max_pos / orig}
    if not isinstance(e.get("truncate", True), bool):
        raise InputError(f"yarn truncate must be true or false, got {e['truncate']!r}")
    return {"method": "yarn", "scale": _factor(e), "orig_ctx": orig or max_pos, "yarn_alpha": e.get("beta_slow")
            or 1.0, "yarn_beta": e.get("beta_fast") or 32.0, "yarn_mscale": e.get("attention_factor"),
            "yarn_mscale_coef": e.get("mscale"), "yarn_mscale_all_dim": e.get("mscale_all_dim"),
            "yarn_truncate": e.get("truncate", True)}


def _proportional_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    # Gemma 4: the model's own partial RoPE; its config states the context
    return {"method": "proportional", "scale": e.get("factor") or 1.0, "orig_ctx": orig or max_pos,
            "rope_proportion": e.get("partial_rotary_factor") or 1.0}


def _llama3_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    return {"method": "llama3", "scale": _factor(e), "orig_ctx": orig or max_pos, "llama3_low": e["low_freq_factor"],
            "llama3_high": e["high_freq_factor"]}


def _longrope_from_hf(e: dict, orig: int | None, max_pos: int) -> dict:
    # Phi-3 configs name no factor: transformers then takes max_position_embeddings / original as it
    orig = orig or max_pos
    for k in ("short_factor", "long_factor"):
        if not isinstance(e.get(k), (list, tuple)):
            raise InputError(f"longrope entries without a {k} list")
    return {"method": "longrope", "scale": e.get("factor") or max_pos / orig, "orig_ctx": orig,
            "longrope_factors": {"short_factor": e["short_factor"], "long_factor": e["long_factor"],
                                 "attention_factor": e.get("attention_factor")}}


# ---------------------------------------------------------------- what each method's settings must satisfy
def _check_none(spec: RopeSpec) -> None:
    if spec.rope_base is not None:
        raise InputError("--rope-base with --rope none: use --rope abf --rope-base B to change the base only")
    if spec.scale != 1:
        raise InputError(f"--scale {spec.scale:g} with --rope none: pick a method ({', '.join(METHODS[1:])})")


def _check_abf(spec: RopeSpec) -> None:
    if spec.rope_base is None:
        raise InputError("--rope abf needs --rope-base B (the new RoPE base)")


def _check_yarn(spec: RopeSpec) -> None:
    if spec.yarn_alpha <= 0:
        raise InputError(f"yarn alpha must be > 0, got {spec.yarn_alpha:g}")
    if spec.yarn_alpha >= spec.yarn_beta:
        raise InputError(f"yarn alpha (slow, {spec.yarn_alpha:g}) must be < yarn beta (fast, {spec.yarn_beta:g})")
    if spec.yarn_mscale is not None and not (isinstance(spec.yarn_mscale, (int, float)) and spec.yarn_mscale > 0):
        raise InputError(f"yarn mscale must be a number > 0, got {spec.yarn_mscale!r}")
    for k in ("yarn_mscale_coef", "yarn_mscale_all_dim"):
        v = getattr(spec, k)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  and v >= 0):
            raise InputError(f"{k} must be a finite number >= 0, got {v!r}")
    if not isinstance(spec.yarn_truncate, bool):
        raise InputError(f"yarn truncate must be true or false, got {spec.yarn_truncate!r}")


def _check_longrope(spec: RopeSpec) -> None:
    if spec.longrope_factors is None:
        raise InputError("--rope longrope needs --longrope-factors FILE (JSON: short_factor, long_factor lists of "
                         "rotary_dim/2 numbers, optional attention_factor)")


def _check_longrope_model(spec: RopeSpec, d: int) -> None:
    f = spec.longrope_factors
    for k in ("short_factor", "long_factor"):
        n = len(getattr(f, k))
        if n != d // 2:  # named: the factors file, else (the config's own entries) the config, by load_config
            src = getattr(f, "source", None)
            raise InputError(f"{'' if src else 'the config longrope entries: '}{k} has {n} values; this model's "
                             f"rotary dim {d} needs {d // 2} (one per pair)", src)


def _check_proportional(spec: RopeSpec) -> None:
    if not 0 < spec.rope_proportion <= 1:
        raise InputError(f"proportional rope needs 0 < partial_rotary_factor <= 1, got {spec.rope_proportion:g}")


def _check_llama3(spec: RopeSpec) -> None:
    if not 0 < spec.llama3_low < spec.llama3_high:
        raise InputError(f"llama3 needs 0 < low_freq_factor < high_freq_factor, got {spec.llama3_low:g}, "
                         f"{spec.llama3_high:g}")


# ---------------------------------------------------------------- what describe adds for a method
# ``details(state, seq_len)``: its own section of ``describe --json`` (state: the config's rope_scaling.hf.RopeState);
# ``lines(d)``: that section in the table (``d``: describe's --json); ``at(d)``: the summary line's note for a method
# that follows the length, at --seq-len.
def _yarn_details(st, seq_len: int) -> dict:
    sp = st.spec
    b = sp.rope_base if sp.rope_base is not None else st.base
    low, high = yarn_correction_range(st.rotary_dim, b, st.orig_ctx, sp.yarn_beta, sp.yarn_alpha,
                                      sp.yarn_truncate)
    return {"yarn": {"alpha": sp.yarn_alpha, "beta": sp.yarn_beta, "ramp_low": low, "ramp_high": high,
                     "truncate": sp.yarn_truncate, "mscale": sp.yarn_mscale_coef,
                     "mscale_all_dim": sp.yarn_mscale_all_dim}}


def _dynamic_yarn_details(st, seq_len: int) -> dict:
    out = _yarn_details(st, seq_len)
    out["yarn"]["scale_at_seq_len"] = _dynamic_yarn_scale(st.spec, st.orig_ctx, seq_len)
    return out


def _yarn_lines(d: dict) -> list[str]:
    y = d["yarn"]
    ends = "" if y.get("truncate", True) else " (exact ends: truncate false)"
    out = [f"yarn alpha {y['alpha']:g} beta {y['beta']:g}: ramp between pair {y['ramp_low']:g} and "
           f"{y['ramp_high']:g}{ends}"]
    if y.get("mscale") is not None or y.get("mscale_all_dim") is not None:
        out.append(f"yarn mscale {y['mscale']} mscale_all_dim {y['mscale_all_dim']}: attention factor "
                   f"{d['attention_factor']:.6g} (DeepSeek's ratio when both are set)")
    return out


def _longrope_details(st, seq_len: int) -> dict:
    f = st.spec.longrope_factors
    return {"longrope": {"set": "long" if seq_len > st.orig_ctx else "short", "hash": f.short_hash,
                         "sha256": f.digest, "source": f.source, "attention_factor": f.attention_factor,
                         "short_factor": list(f.short_factor), "long_factor": list(f.long_factor)}}


def _longrope_lines(d: dict) -> list[str]:
    lr = d["longrope"]
    att = "default sqrt(1 + ln s / ln orig)" if lr["attention_factor"] is None else f"{lr['attention_factor']:g}"
    return [f"longrope factors {lr['hash']} ({lr['source'] or 'from the config'}; sha256 {lr['sha256']}); "
            f"attention factor {att}"]


def _dynamic_ntk_at(d: dict) -> str:
    """The length it was read at and the NTK scale transformers' rule runs there (:func:`dynamic_ntk_scale`): a row
    labelled ``dynamic_ntk x2`` runs NTK x3 at 16K."""
    s = dynamic_ntk_scale(d["scale"], d["seq_len"], d["orig_ctx"])
    return f"  (dynamic NTK at seq_len {d['seq_len']}: NTK x{s:.3g} there)"


def _dynamic_yarn_at(d: dict) -> str:
    L = d["seq_len"]
    return f"  (dynamic YaRN at seq_len {L}: s = max(1, {L} / {d['orig_ctx']}) = {d['yarn']['scale_at_seq_len']:g})"


def _longrope_at(d: dict) -> str:
    lr = d["longrope"]
    side = "past" if lr["set"] == "long" else "within"
    return f"  (longrope at seq_len {d['seq_len']}: the {lr['set']} factors, {side} the original context)"


@dataclass(frozen=True)
class Describe:
    """What ``rope_scaling describe`` adds for a method (see the functions above)."""

    details: Callable[[Any, int], dict] | None = None
    lines: Callable[[dict], list[str]] | None = None
    at: Callable[[dict], str] | None = None


# ---------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Method:
    """One RoPE method: everything about it in one place (see module doc)."""

    name: str
    help: str  # one line in describe's --help
    freqs: Callable[[int, float, RopeSpec, int | None], Freqs]
    hf: Callable[[RopeSpec, float, int], tuple[dict, int]]
    check: Callable[[RopeSpec], None] | None = None
    user: bool = True  # --rope may ask for it (False: only read from a model's config)
    needs_orig_ctx: bool = False  # the formula uses the original context
    reads: str | None = None  # the HF rope_type read back as this method from a config alone
    from_hf: Callable[[dict, int | None, int], dict] | None = None  # (entries, orig, max_pos) -> spec fields
    check_model: Callable[[RopeSpec, int], None] | None = None  # the spec against a model's rotary dim d
    by_length: bool = False  # the frequencies depend on the current length (seq_len)
    owns: tuple[str, ...] = ()  # the RopeSpec fields that belong to it: refused off their default on other methods
    plain: bool = False  # the model's own RoPE, no scaling (what no --rope means)
    states_context: bool = False  # the config's max_position_embeddings is its extended context (native llama3)
    per_forward: bool = False  # this repo recomputes the frequencies in every forward (HF entries cannot say it)
    changes_base: bool = False  # a new base: describe adds Liu et al.'s critical dimension
    one_base: bool = False  # plain RoPE at one base (the model's or a new one) at any length: Liu et al. 2023's case
    describe: Describe = Describe()
    scale_at: Callable[[RopeSpec, int, int], float] | None = None  # its s at (spec, orig, seq_len); None: spec.scale

    def scale_at_length(self, spec: RopeSpec, orig_ctx: int, seq_len: int) -> float:
        """The s the method applies at ``seq_len`` (what a pair divided by exactly s is compared with)."""
        return spec.scale if self.scale_at is None else self.scale_at(spec, orig_ctx, seq_len)


_YARN = ("yarn_alpha", "yarn_beta")
REGISTRY: dict[str, Method] = {m.name: m for m in (
    Method("none", "unchanged", _none, _default_hf, _check_none, reads="default", from_hf=_none_from_hf,
           plain=True, states_context=True, one_base=True),
    Method("pi", "position interpolation (positions / s)", _pi, _pi_hf, reads="linear", from_hf=_pi_from_hf),
    Method("ntk", "static NTK-aware (base * s^(d/(d-2)))", _ntk, _ntk_hf, changes_base=True, one_base=True),
    Method("dynamic_ntk", "NTK base recomputed from the current length (transformers 'dynamic')", _dynamic_ntk,
           _dynamic_ntk_hf, needs_orig_ctx=True, reads="dynamic", from_hf=_dynamic_ntk_from_hf, by_length=True,
           changes_base=True, describe=Describe(at=_dynamic_ntk_at)),
    Method("yarn", "NTK-by-parts + attention temperature", _yarn, _yarn_hf, _check_yarn, needs_orig_ctx=True,
           reads="yarn", from_hf=_yarn_from_hf,
           owns=(*_YARN, "yarn_mscale", "yarn_mscale_coef", "yarn_mscale_all_dim", "yarn_truncate"),
           describe=Describe(_yarn_details, _yarn_lines)),
    Method("dynamic_yarn", "YaRN at scale max(1, current length / orig-ctx), per sample (the YaRN repo's dynamic "
           "YaRN; written as static yarn x s for plain transformers)", _dynamic_yarn, _dynamic_yarn_hf, _check_yarn,
           needs_orig_ctx=True, by_length=True, owns=_YARN, per_forward=True,
           describe=Describe(_dynamic_yarn_details, _yarn_lines, _dynamic_yarn_at), scale_at=_dynamic_yarn_scale),
    Method("abf", "a new base (--rope-base)", _abf, _default_hf, _check_abf, changes_base=True, one_base=True),
    Method("llama3", "Llama 3.1 scaling (--llama3-low-freq-factor, --llama3-high-freq-factor)", _llama3, _llama3_hf,
           _check_llama3, needs_orig_ctx=True, reads="llama3", from_hf=_llama3_from_hf, states_context=True,
           owns=("llama3_low", "llama3_high")),
    Method("longrope", "per-pair rescale factors from --longrope-factors FILE (LongRoPE / Phi-3 'longrope')",
           _longrope, _longrope_hf, _check_longrope, needs_orig_ctx=True, reads="longrope",
           from_hf=_longrope_from_hf, check_model=_check_longrope_model, by_length=True, owns=("longrope_factors",),
           describe=Describe(_longrope_details, _longrope_lines, _longrope_at)),
    Method("proportional", "partial RoPE over the whole head, zero frequencies past the rotated part (transformers "
           "'proportional', Gemma 4; read from a config)", _proportional, _proportional_hf, _check_proportional,
           user=False, reads="proportional", from_hf=_proportional_from_hf, states_context=True,
           owns=("rope_proportion",)),
)}
METHODS = tuple(n for n, m in REGISTRY.items() if m.user)  # what a user can ask for (--rope's choices)
NATIVE_METHODS = tuple(n for n, m in REGISTRY.items() if not m.user)  # read from configs; apply_rope writes it back
PLAIN = next(n for n, m in REGISTRY.items() if m.plain)  # the method of an unscaled model ("none")
PROPORTIONAL = "proportional"  # its rotary dim is the whole head (rope_scaling.hf.rotary_dim)


def method_hint(name) -> str:
    """`` (did you mean pi? ...)`` for a --rope value that is not a method: transformers' rope type of one (linear ->
    pi, dynamic -> dynamic_ntk), another case or spelling (YaRN, dynamic-ntk) or a near miss; "" when none is near."""
    import difflib

    n = str(name).strip()
    key = n.lower().replace("-", "_")
    readers = {t: m.name for t, m in hf_readers().items() if m.user and t != m.name}
    if key in readers:
        return f" (did you mean {readers[key]}? transformers calls it {key!r})"
    if key in METHODS:
        return f" (did you mean {key}? method names are lower case with underscores)"
    near = difflib.get_close_matches(key, METHODS, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


# The largest extension each method's own paper (or model card) reports: past it, a one-line warning (a typo, or a
# setting nobody has measured). PI: 2K -> 32K on LLaMA (Chen et al. 2023, Sec 3); YaRN: x32 (Llama 2 at 128K,
# Peng et al. 2023, Sec 4); dynamic NTK / NTK: YaRN's Table 1-2 runs to x32 too; llama3: x8 (Llama 3.1's config);
# LongRoPE: x512 (4K -> 2048K, Ding et al. 2024).
PUBLISHED = {"pi": 16.0, "ntk": 32.0, "dynamic_ntk": 32.0, "yarn": 32.0, "dynamic_yarn": 32.0, "llama3": 8.0,
             "longrope": 512.0}


def range_warning(spec: RopeSpec) -> str | None:
    """One line when ``spec.scale`` is past the largest extension its method's sources report (:data:`PUBLISHED`),
    else None."""
    top = PUBLISHED.get(spec.method)
    if top is None or spec.scale <= top:
        return None
    return (f"warning: --rope {spec.method} --scale {spec.scale:g} is past the largest extension its sources report "
            f"(x{top:g}, docs/rope_methods.md): unmeasured, or a typo")


def hf_readers() -> dict[str, Method]:
    """HF rope_type -> the registry method that reads it back from a config alone (``Method.reads``)."""
    return {m.reads: m for m in REGISTRY.values() if m.reads}


def owners(field: str) -> tuple[str, ...]:
    """The methods a RopeSpec field belongs to (``Method.owns``); () for the fields every method reads."""
    return tuple(n for n, m in REGISTRY.items() if field in m.owns)


def check_model(spec: RopeSpec, d: int) -> None:
    """InputError when ``spec`` cannot run on a model with rotary dim ``d`` (longrope: one factor per pair)."""
    m = REGISTRY[spec.method]
    if m.check_model is not None:
        m.check_model(spec, d)


def frequencies(spec: RopeSpec, head_dim: int, base: float, seq_len: int | None = None) -> Freqs:
    """The rope a spec implies for a model with ``head_dim`` and original ``base``: ABF first (``rope_base``
    replaces the base), then the method. ``seq_len`` (the current length) matters only for the methods that follow
    it (``Method.by_length``); None means the original context."""
    if spec.orig_ctx is None and REGISTRY[spec.method].needs_orig_ctx:
        raise ValueError(f"{spec.method} needs orig_ctx")
    b = spec.rope_base if spec.rope_base is not None else base
    return REGISTRY[spec.method].freqs(head_dim, float(b), spec, seq_len)


def hf_entries(spec: RopeSpec, base: float, d: int) -> tuple[dict, int]:
    """(rope entries, max_position_embeddings) expressing a resolved spec (orig_ctx set) on a model with RoPE
    ``base`` and rotary dim ``d``."""
    b = spec.rope_base if spec.rope_base is not None else base
    return REGISTRY[spec.method].hf(spec, float(b), d)


def rescale_factors(spec: RopeSpec, head_dim: int, base: float, seq_len: int | None = None) -> list[float]:
    """theta_i / theta'_i per pair: the spec as LongRoPE's per-pair rescale factors lambda_i (PI: s everywhere; NTK:
    s^(2i/(d-2)); YaRN: 1 to s along its ramp) -- the search's initial population (LongRoPE arXiv 2402.13753 Sec
    3.2). The model's own base (no ABF: a new base is not a rescale of the old one)."""
    if spec.rope_base is not None:
        raise ValueError("rescale factors of a spec with --rope-base: the base itself changes")
    new = frequencies(spec, head_dim, base, seq_len).inv_freq
    return [a / b for a, b in zip(rope_inv_freq(head_dim, float(base)), new)]
