"""RopeSpec: what RoPE setting to apply (or what a config carries), validated on construction.

Its fields are settings (``ropescale.common.settings``): every stage nests it in its own settings, so the same ``--rope
--scale --rope-base --orig-ctx --yarn-alpha --yarn-beta --yarn-mscale --replace --llama3-low-freq-factor
--llama3-high-freq-factor --longrope-factors`` flags, recipe keys and run.json record come from this one list.

LongRoPE's factors (:class:`LongRopeFactors`) are read from their file once, when the flag or recipe key is parsed,
and held in the spec as tuples: the spec records them whole (run.json), compares them (resume checks, "the same
setting again"), and names them in its label by a hash of their content (``longrope x8 factors=3f2a9c1b``), so two
files with the same numbers are the same setting and a run never depends on the file still being there.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ropescale.common.attention_extend import METHODS as ATTENTION_METHODS
from ropescale.common.attention_extend import check as check_attention
from ropescale.common.io import InputError, read_json
from ropescale.common.settings import flag_of, setting

from .formulas import METHODS, PLAIN, REGISTRY, hf_readers, method_hint, owners

GROUP = "RoPE scaling (written into the model's config as plain transformers entries)"
MORE = "advanced: RoPE method parameters"  # a method's own knobs: listed by name in --help (--help-all explains)
# The longest context a setting may ask for (2**24 = 16,777,216 tokens): past anything these code paths can run
# (the longest published fine-tune, ALST's 15M tokens, needed 32 GPUs); a larger orig_ctx x scale is a typo.
MAX_CONTEXT = 1 << 24


FACTOR_KEYS = ("short_factor", "long_factor", "attention_factor")


@dataclass(frozen=True)
class LongRopeFactors:
    """LongRoPE's per-pair rescale factors: theta'_i = theta_i / factor_i, ``short_factor`` for lengths within the
    original context, ``long_factor`` past it (transformers' switch), and the attention factor on cos/sin (None:
    sqrt(1 + ln s / ln orig), LongRoPE's and transformers' default). Checked on construction (same length, every
    value a finite number > 0; the length against a model's rotary dim is checked where the spec meets a config,
    ``formulas.check_model``). ``source``: the file they came from (messages only; not compared, not hashed)."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    attention_factor: float | None = None
    source: str | None = field(default=None, compare=False)

    def __post_init__(self):
        where = self.source
        for k in ("short_factor", "long_factor"):
            v = getattr(self, k)
            if not isinstance(v, (list, tuple)) or not v:
                raise InputError(f"{k} must be a non-empty list of numbers, got {_short(v)}", where)
            bad = [x for x in v if not _positive(x)]
            if bad:
                raise InputError(f"{k} values must be finite numbers > 0, got {_short(bad[0])} "
                                 f"(at index {list(v).index(bad[0])})", where)
            object.__setattr__(self, k, tuple(float(x) for x in v))
        if len(self.short_factor) != len(self.long_factor):
            raise InputError(f"short_factor has {len(self.short_factor)} values, long_factor {len(self.long_factor)}: "
                             f"both need one per rotary pair", where)
        if self.attention_factor is not None:
            if not _positive(self.attention_factor):
                raise InputError(f"attention_factor must be a finite number > 0, got {_short(self.attention_factor)}",
                                 where)
            object.__setattr__(self, "attention_factor", float(self.attention_factor))

    def to_json(self) -> dict:
        """The factor file's content (``--longrope-factors FILE``): short_factor, long_factor, attention_factor when
        set."""
        d = {"short_factor": list(self.short_factor), "long_factor": list(self.long_factor)}
        if self.attention_factor is not None:
            d["attention_factor"] = self.attention_factor
        return d

    @property
    def digest(self) -> str:
        """sha256 of the factors' content (canonical JSON of the float values; the file's formatting, its name and
        the way a number is written -- 1 or 1.0 -- do not change it)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def short_hash(self) -> str:
        """The first 8 hex digits of :attr:`digest`: how a label names the factors."""
        return self.digest[:8]

    def check_monotone(self) -> None:
        """InputError unless long_factor is non-decreasing with the pair index (longer wavelength, larger factor:
        LongRoPE's search constraint, arXiv 2402.13753 Sec 3.2)."""
        for i in range(1, len(self.long_factor)):
            if self.long_factor[i] < self.long_factor[i - 1]:
                raise InputError(f"long_factor is not monotone: value {i} ({self.long_factor[i]:g}) is below value "
                                 f"{i - 1} ({self.long_factor[i - 1]:g}); the factors must not decrease with the pair "
                                 f"index", self.source)

    def __str__(self) -> str:
        return f"factors={self.short_hash}" + (f" ({self.source})" if self.source else "")

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "LongRopeFactors":
        """From a factor file's object (or a recorded spec's ``longrope_factors``); an unknown key is an error."""
        if not isinstance(d, dict):
            raise InputError(f"LongRoPE factors must be a JSON object with {', '.join(FACTOR_KEYS)}, got "
                             f"{type(d).__name__}", source)
        d = dict(d)
        source = d.pop("source", None) if source is None else source
        d.pop("source", None)
        unknown = sorted(set(d) - set(FACTOR_KEYS))
        if unknown:
            raise InputError(f"unknown key(s) {', '.join(unknown)} (a LongRoPE factor file holds "
                             f"{', '.join(FACTOR_KEYS)})", source)
        missing = [k for k in ("short_factor", "long_factor") if k not in d]
        if missing:
            raise InputError(f"no {' / '.join(missing)} (a LongRoPE factor file holds short_factor and long_factor "
                             f"lists, one number per rotary pair, and optionally attention_factor)", source)
        return cls(d["short_factor"], d["long_factor"], d.get("attention_factor"), source=source)


def read_longrope_factors(path: str | Path, *, rotary_dim: int | None = None,
                          monotone: bool = False) -> LongRopeFactors:
    """A LongRoPE factor file (JSON object: short_factor, long_factor, optional attention_factor); every problem is
    an InputError naming the file: malformed JSON, unknown or missing keys, a value that is not a finite number > 0,
    lists of different lengths, a length other than ``rotary_dim / 2`` (when given), and with ``monotone`` a
    long_factor that decreases somewhere."""
    f = LongRopeFactors.from_dict(read_json(path, "LongRoPE factor file"), source=str(path))
    if rotary_dim is not None and len(f.long_factor) != rotary_dim // 2:
        raise InputError(f"{len(f.long_factor)} factors per list; rotary dim {rotary_dim} needs {rotary_dim // 2}",
                         path)
    if monotone:
        f.check_monotone()
    return f


def _factors(v) -> LongRopeFactors | None:
    """``--longrope-factors`` / the recipe key / a record: a file path, a dict (recorded), or factors already read."""
    if v is None or isinstance(v, LongRopeFactors):
        return v
    if isinstance(v, dict):
        return LongRopeFactors.from_dict(v)
    if isinstance(v, (str, Path)) and str(v).strip().lower() in ("", "none", "null"):
        return None
    if isinstance(v, (str, Path)):
        return read_longrope_factors(v)
    raise InputError(f"LongRoPE factors must be a file path or an object, got {_short(v)}")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _method(v) -> str:
    """--rope's value: a registry method's name, else a ValueError with the near one (``formulas.method_hint``)."""
    v = str(v).strip()
    if v in REGISTRY:
        return v
    raise ValueError(f"{v!r} is not a RoPE method (choose from {', '.join(METHODS)}){method_hint(v)}")


def _method_help() -> str:
    """--rope's help: the methods by name (each one's line in ``describe``'s help and docs/rope_methods.md)."""
    return (f"{', '.join(METHODS)} (abf with --rope-base, longrope with --longrope-factors; what each does: "
            "docs/rope_methods.md)")


@dataclass(frozen=True)
class RopeSpec:
    """A RoPE scaling setting.

    method      none | pi | ntk | dynamic_ntk | yarn | dynamic_yarn | abf | llama3 | longrope
    scale       s >= 1: the context extension factor (target context = orig_ctx * s)
    rope_base   a new RoPE base (ABF); required for abf, optional for the others (applied first)
    orig_ctx    the original (pre-training) context; None = take it from the config
    yarn_alpha  YaRN beta_slow: pairs turning fewer than alpha times over orig_ctx are fully interpolated
    yarn_beta   YaRN beta_fast: pairs turning more than beta times are left unchanged (extrapolated)
    yarn_mscale YaRN attention factor on cos/sin; None = 0.1*ln(s)+1 (or DeepSeek's ratio below)
    yarn_mscale_coef, yarn_mscale_all_dim  DeepSeek's mscale / mscale_all_dim: factor (0.1 c ln s + 1) / (0.1 c' ln s
                + 1) when both are set (transformers' ``_compute_yarn_parameters``)
    yarn_truncate  YaRN's ramp ends rounded to whole pairs (True, the paper's code); False: gpt-oss' exact ends
    replace     allow replacing scaling the config already carries (e.g. Llama-3.x ``llama3``)
    llama3_low, llama3_high  low/high_freq_factor of llama3 scaling (Llama 3.1 ships 1 and 4)
    longrope_factors  LongRoPE's per-pair factors (:class:`LongRopeFactors`), read from ``--longrope-factors FILE``
    """

    method: str = setting("none", _method_help(), key="rope", choices=METHODS, metavar="METHOD", group=GROUP,
                         parse=_method)
    scale: float = setting(1.0, "context extension factor s >= 1: the target context is orig-ctx x s", metavar="S",
                           group=GROUP)
    rope_base: float | None = setting(None, "a new RoPE base (ABF); required with --rope abf, applied before any "
                                            "other method", metavar="B", group=GROUP)
    orig_ctx: int | None = setting(None, "the original (pre-training) context; default: the config's "
                                         "original_max_position_embeddings, else max_position_embeddings",
                                   metavar="N", group=GROUP)
    yarn_alpha: float = setting(1.0, "YaRN alpha (beta_slow): rotary pairs turning fewer than A times over the "
                                     "original context are fully interpolated (yarn, dynamic_yarn)", metavar="A",
                                group=MORE)
    yarn_beta: float = setting(32.0, "YaRN beta (beta_fast): pairs turning more than B times are left unchanged "
                                     "(yarn, dynamic_yarn)", metavar="B", group=MORE)
    yarn_mscale: float | None = setting(None, "YaRN attention factor on cos/sin; default: 0.1 ln(s) + 1",
                                        metavar="M", group=MORE)
    replace: bool = setting(False, "replace RoPE scaling the model already carries (e.g. Llama-3.x llama3) "
                                   "instead of refusing to stack a second method", group=MORE)
    llama3_low: float = setting(1.0, "--rope llama3: low_freq_factor (pairs with wavelength > orig-ctx / F are "
                                     "divided by s)", key="llama3_low_freq_factor", metavar="F", group=MORE)
    llama3_high: float = setting(4.0, "--rope llama3: high_freq_factor (pairs with wavelength < orig-ctx / F are "
                                      "kept; a smooth blend between)", key="llama3_high_freq_factor", metavar="F",
                                 group=MORE)
    longrope_factors: LongRopeFactors | None = setting(
        None, "--rope longrope: JSON file of LongRoPE factors (short_factor and long_factor: one number per rotary "
              "pair; optional attention_factor), e.g. what 'rope_scaling search' writes", metavar="FILE",
        parse=_factors, group=MORE)
    yarn_mscale_coef: float | None = setting(
        None, "YaRN (DeepSeek-V3 / Kimi-K2 'mscale'): with --yarn-mscale-all-dim C', the attention factor is "
              "(0.1 C ln s + 1) / (0.1 C' ln s + 1), as transformers computes it", metavar="C", group=MORE)
    yarn_mscale_all_dim: float | None = setting(
        None, "YaRN (DeepSeek 'mscale_all_dim'): the C' of --yarn-mscale-coef", metavar="C", group=MORE)
    yarn_truncate: bool = setting(True, "YaRN: round the ramp's ends to whole pairs (floor / ceil); false: the "
                                        "exact ends (gpt-oss 'truncate: false')", group=MORE)
    rope_layers: str = setting("full", "a per-layer-type config (Gemma 3: sliding-window and full-attention layers): "
                                       "full scales the full_attention layers only, as Gemma 3's own config does; all "
                                       "scales every layer type, each at its own base", choices=("full", "all"),
                               metavar="{full,all}", group=MORE)
    rope_proportion: float = setting(1.0, "proportional rope (read from a Gemma 4 config): the rotated share of the "
                                          "head", cli=False, group=MORE)
    attention_extend: str = setting("none", "a training-free attention-level method on top of the RoPE: self_extend "
                                            "(Jin et al. 2024; --grp-attn-n, --grp-attn-w) or dca (An et al. 2024; "
                                            "--dca-chunk-size, --dca-local-size); docs/rope_methods.md",
                                    choices=ATTENTION_METHODS, metavar="METHOD", group=MORE)
    grp_attn_n: int | None = setting(None, "Self-Extend's group size G (llama.cpp's name): keys W or more tokens "
                                           "back are seen at positions // G", metavar="G", group=MORE)
    grp_attn_w: int | None = setting(None, "Self-Extend's neighbour window W (a multiple of G): the nearest W keys "
                                           "keep their positions", metavar="W", group=MORE)
    dca_chunk_size: int | None = setting(None, "DCA's chunk_size (Qwen2.5-1M's dual_chunk_attention_config); default: "
                                               "3/4 of the original context, as the authors' code", metavar="C",
                                         group=MORE)
    dca_local_size: int | None = setting(None, "DCA's local_size; default: 1/8 of the original context",
                                         metavar="L", group=MORE)

    def __post_init__(self):
        """Normalise, then check: the numbers, the context, the fields that belong to one method, the method's own
        rule (``formulas.REGISTRY``)."""
        if isinstance(self.orig_ctx, float) and self.orig_ctx.is_integer():
            object.__setattr__(self, "orig_ctx", int(self.orig_ctx))
        if self.method not in REGISTRY:
            raise InputError(f"unknown RoPE method {self.method!r} (choose from {', '.join(METHODS)})"
                             f"{method_hint(self.method)}")
        self._check_numbers()
        self._check_context()
        object.__setattr__(self, "longrope_factors", _factors(self.longrope_factors))
        self._check_method_fields()
        check = REGISTRY[self.method].check
        if check is not None:
            check(self)
        for k in ("grp_attn_n", "grp_attn_w", "dca_chunk_size", "dca_local_size"):
            v = getattr(self, k)
            if isinstance(v, float) and v.is_integer():
                object.__setattr__(self, k, int(v))
        check_attention(self.attention_extend, self.grp_attn_n, self.grp_attn_w, self.dca_chunk_size,
                        self.dca_local_size)
        for k in ("scale", "rope_base", "yarn_alpha", "yarn_beta", "yarn_mscale", "yarn_mscale_coef",
                  "yarn_mscale_all_dim", "llama3_low", "llama3_high"):
            v = getattr(self, k)
            if v is not None:
                object.__setattr__(self, k, float(v))

    def _check_numbers(self) -> None:
        for k in ("scale", "yarn_alpha", "yarn_beta", "llama3_low", "llama3_high", "rope_proportion"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(f"{k} must be a finite number, got {v!r}")
        if self.scale < 1:
            raise InputError(f"scale must be >= 1 (the context extension factor), got {self.scale:g}")
        if self.rope_base is not None and not (isinstance(self.rope_base, (int, float)) and self.rope_base > 1
                                               and math.isfinite(self.rope_base)):
            raise InputError(f"rope base must be a number > 1, got {self.rope_base!r}")

    def _check_context(self) -> None:
        if self.orig_ctx is not None and (not isinstance(self.orig_ctx, int) or isinstance(self.orig_ctx, bool)
                                          or self.orig_ctx < 1):
            raise InputError(f"original context must be a positive integer, got {self.orig_ctx!r}")
        if self.scale > MAX_CONTEXT or (self.orig_ctx is not None and self.orig_ctx * self.scale > MAX_CONTEXT):
            raise InputError(f"scale {self.scale:g} asks for a context beyond {MAX_CONTEXT:,} tokens "
                             f"(rope_scaling.spec.MAX_CONTEXT): a typo?")

    def _check_method_fields(self) -> None:
        """A field that belongs to some methods (``formulas.Method.owns``) is refused off its default on the
        others."""
        for f in fields(self):
            own = owners(f.name)
            if own and self.method not in own and getattr(self, f.name) != f.default:
                m = f.metadata["setting"]
                flag = m.flag or flag_of(m.key or f.name)
                raise InputError(f"{flag} only applies to --rope {' / '.join(own)}, not {self.method}")

    @property
    def scaled(self) -> bool:
        """Whether the spec changes the model's own RoPE (any method but the plain one, ``none``)."""
        return not REGISTRY[self.method].plain

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RopeSpec":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        if not isinstance(d, dict):
            raise InputError(f"a rope spec must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown rope spec key(s): {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_record(cls, rec, where=None) -> "RopeSpec":
        """The one reader of a recorded rope (run.json ``rope``, export.json, a scores file): a spec dict (missing
        keys take their defaults), an older ``{"rope": "none"}`` / ``{"type"|"rope_type": ..., "factor": ...}``
        form, a bare method name, or nothing (= none). Anything else is an InputError naming ``where``."""
        if rec is None or rec == {}:
            return cls()
        if isinstance(rec, str):
            return cls(rec) if rec in REGISTRY else cls()
        if not isinstance(rec, dict):
            raise InputError(f"unreadable rope record {rec!r}", where)
        d = dict(rec)
        for old, new in (("rope", "method"), ("type", "method"), ("rope_type", "method"), ("factor", "scale")):
            if old in d and new not in d:
                d[new] = d.pop(old)
            d.pop(old, None)
        readers = hf_readers()  # an HF rope type recorded as the method: the method that reads it
        d["method"] = PLAIN if d.get("method") is None else getattr(readers.get(d["method"]), "name", d["method"])
        if d["method"] in REGISTRY and REGISTRY[d["method"]].plain:
            d.pop("scale", None)
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        return cls(**d)

    def same_rope(self, other: "RopeSpec") -> bool:
        """True when both describe the same rope (``replace`` ignored; numbers compared to rel 1e-9, LongRoPE factors
        by value, whatever file they came from)."""
        for f in fields(self):
            if f.name == "replace":
                continue
            x, y = getattr(self, f.name), getattr(other, f.name)
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9):
                    return False
            elif x != y:
                return False
        return True

    def label(self, shown=()) -> str:
        """The one way a RoPE setting is written, in messages and in every report: ``none``, ``ntk x8``,
        ``abf x1 base=8e4``, ``yarn x8 a=0.1``, ``longrope x8 factors=3f2a9c1b``. The method and scale always; a
        set base, YaRN / llama3 fields off their defaults and LongRoPE factors (by content hash) too; ``shown`` adds
        fields by name even at their defaults (``rope_base``, ``yarn_alpha``, ``yarn_beta``, ``yarn_mscale``,
        ``orig_ctx``, ``llama3_low``, ``llama3_high``): a report passes the fields that differ between the rows it
        shows, so two rows never read the same."""
        parts = [f"{self.method} x{_num(self.scale)}"] if self.scaled else [self.method]
        defaults = {f.name: f.default for f in fields(self)}
        for name, short in _LABEL_FIELDS:
            own = owners(name)  # yarn_* / llama3_* fields belong to their methods
            if own and self.method not in own or not self.scaled and name != "rope_base":
                continue
            v = getattr(self, name)
            if name in shown or (v is not None and v != defaults[name] and name != "orig_ctx"):
                parts.append(f"{short}={_num(v)}")
        if self.longrope_factors is not None:
            parts.append(f"factors={self.longrope_factors.short_hash}")
        if not self.scaled and self.attention_extend != "none":
            return self.attention_label().lstrip(" +")
        return " ".join(parts) + self.attention_label()

    def attention_label(self) -> str:
        """`` +self_extend G=8 W=64`` / `` +dca C=48 L=8`` (the sizes given), "" without an attention method."""
        if self.attention_extend == "none":
            return ""
        given = [(k, v) for k, v in (("G", self.grp_attn_n), ("W", self.grp_attn_w), ("C", self.dca_chunk_size),
                                     ("L", self.dca_local_size)) if v is not None]
        return " +" + " ".join([self.attention_extend] + [f"{k}={v}" for k, v in given])

    def rope_only(self) -> "RopeSpec":
        """The spec without its attention method: what is written into a config (``hf.apply_rope``); the attention
        method is installed on the loaded model (``rope_scaling.load.load_model``)."""
        return replace(self, attention_extend="none", grp_attn_n=None, grp_attn_w=None, dca_chunk_size=None,
                       dca_local_size=None)

    def attention_fields(self) -> dict:
        """The attention method's fields (see :meth:`rope_only`)."""
        return {k: getattr(self, k) for k in ATTENTION_FIELDS}


ATTENTION_FIELDS = ("attention_extend", "grp_attn_n", "grp_attn_w", "dca_chunk_size", "dca_local_size")
_LABEL_FIELDS = (("rope_base", "base"), ("yarn_alpha", "a"), ("yarn_beta", "b"), ("yarn_mscale", "mscale"),
                 ("yarn_mscale_coef", "mscale_coef"), ("yarn_mscale_all_dim", "mscale_all_dim"),
                 ("yarn_truncate", "truncate"), ("rope_proportion", "p"), ("rope_layers", "layers"),
                 ("orig_ctx", "orig"), ("llama3_low", "low"), ("llama3_high", "high"))


def _num(v) -> str:
    """A number as a label writes it: 8, 0.1, 2.5, and bases as 8e4 / 5e5 / 1e6 (``%g`` otherwise); a bool as
    true / false."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str):
        return v
    v = float(v)
    if v >= 1e4 and v.is_integer():
        e = len(str(int(v))) - 1
        m = v / 10 ** e
        if round(m, 2) == m:
            return f"{m:g}e{e}"
    return f"{v:g}"
