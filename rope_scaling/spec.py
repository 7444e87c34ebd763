"""RopeSpec: what RoPE setting to apply (or what a config carries), validated on construction.

Its fields are settings (``ropescale.common.settings``): every stage nests it in its own settings, so the same ``--rope
--scale --rope-base --orig-ctx --yarn-alpha --yarn-beta --yarn-mscale --replace`` flags, recipe keys and run.json
record come from this one list.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .formulas import METHODS, NATIVE_METHODS, REGISTRY

GROUP = "RoPE scaling (written into the model's config as plain transformers entries)"
# The longest context a setting may ask for (2**24 = 16,777,216 tokens): past anything these code paths can run
# (the longest published fine-tune, ALST's 15M tokens, needed 32 GPUs); a larger orig_ctx x scale is a typo.
MAX_CONTEXT = 1 << 24


def _method_help() -> str:
    return "; ".join(f"{n}: {REGISTRY[n].help}" for n in METHODS)


@dataclass(frozen=True)
class RopeSpec:
    """A RoPE scaling setting.

    method      none | pi | ntk | dynamic_ntk | yarn | abf (and llama3, only as read from a Llama-3.x config)
    scale       s >= 1: the context extension factor (target context = orig_ctx * s)
    rope_base   a new RoPE base (ABF); required for abf, optional for the others (applied first)
    orig_ctx    the original (pre-training) context; None = take it from the config
    yarn_alpha  YaRN beta_slow: pairs turning fewer than alpha times over orig_ctx are fully interpolated
    yarn_beta   YaRN beta_fast: pairs turning more than beta times are left unchanged (extrapolated)
    yarn_mscale YaRN attention factor on cos/sin; None = 0.1*ln(s)+1
    replace     allow replacing scaling the config already carries (e.g. Llama-3.x ``llama3``)
    llama3_low, llama3_high  low/high_freq_factor of native llama3 scaling
    """

    method: str = setting("none", _method_help(), key="rope", choices=METHODS, metavar="METHOD", group=GROUP)
    scale: float = setting(1.0, "context extension factor s >= 1: the target context is orig-ctx x s", metavar="S",
                           group=GROUP)
    rope_base: float | None = setting(None, "a new RoPE base (ABF); required with --rope abf, applied before any "
                                            "other method", metavar="B", group=GROUP)
    orig_ctx: int | None = setting(None, "the original (pre-training) context; default: the config's "
                                         "original_max_position_embeddings, else max_position_embeddings",
                                   metavar="N", group=GROUP)
    yarn_alpha: float = setting(1.0, "YaRN alpha (beta_slow): rotary pairs turning fewer than A times over the "
                                     "original context are fully interpolated", metavar="A", group=GROUP)
    yarn_beta: float = setting(32.0, "YaRN beta (beta_fast): pairs turning more than B times are left unchanged",
                               metavar="B", group=GROUP)
    yarn_mscale: float | None = setting(None, "YaRN attention factor on cos/sin; default: 0.1 ln(s) + 1",
                                        metavar="M", group=GROUP)
    replace: bool = setting(False, "replace RoPE scaling the model already carries (e.g. Llama-3.x llama3) "
                                   "instead of refusing to stack a second method", group=GROUP)
    llama3_low: float = setting(1.0, "low_freq_factor of native llama3 scaling", cli=False, recipe=False)
    llama3_high: float = setting(4.0, "high_freq_factor of native llama3 scaling", cli=False, recipe=False)

    def __post_init__(self):
        if isinstance(self.orig_ctx, float) and self.orig_ctx.is_integer():
            object.__setattr__(self, "orig_ctx", int(self.orig_ctx))
        if self.method not in METHODS + NATIVE_METHODS:
            raise InputError(f"unknown RoPE method {self.method!r} (choose from {', '.join(METHODS)})")
        num = {"scale": self.scale, "yarn_alpha": self.yarn_alpha, "yarn_beta": self.yarn_beta}
        for k, v in num.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(f"{k} must be a finite number, got {v!r}")
        if self.scale < 1:
            raise InputError(f"scale must be >= 1 (the context extension factor), got {self.scale:g}")
        if self.scale > MAX_CONTEXT or (self.orig_ctx is not None and isinstance(self.orig_ctx, int)
                                        and self.orig_ctx * self.scale > MAX_CONTEXT):
            raise InputError(f"scale {self.scale:g} asks for a context beyond {MAX_CONTEXT:,} tokens "
                             f"(rope_scaling.spec.MAX_CONTEXT): a typo?")
        if self.rope_base is not None and not (isinstance(self.rope_base, (int, float)) and self.rope_base > 1
                                               and math.isfinite(self.rope_base)):
            raise InputError(f"rope base must be a number > 1, got {self.rope_base!r}")
        if self.orig_ctx is not None and (not isinstance(self.orig_ctx, int) or isinstance(self.orig_ctx, bool)
                                          or self.orig_ctx < 1):
            raise InputError(f"original context must be a positive integer, got {self.orig_ctx!r}")
        if self.yarn_mscale is not None and self.method != "yarn":
            raise InputError(f"--yarn-mscale only applies to --rope yarn, not {self.method}")
        check = REGISTRY[self.method].check
        if check is not None:
            check(self)
        for k in ("scale", "rope_base", "yarn_alpha", "yarn_beta", "yarn_mscale", "llama3_low", "llama3_high"):
            v = getattr(self, k)
            if v is not None:
                object.__setattr__(self, k, float(v))

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
            return cls(rec if rec in METHODS + NATIVE_METHODS else "none")
        if not isinstance(rec, dict):
            raise InputError(f"unreadable rope record {rec!r}", where)
        d = dict(rec)
        for old, new in (("rope", "method"), ("type", "method"), ("rope_type", "method"), ("factor", "scale")):
            if old in d and new not in d:
                d[new] = d.pop(old)
            d.pop(old, None)
        if d.get("method") in (None, "default"):
            d["method"] = "none"
        if d["method"] == "none":
            d.pop("scale", None)
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        return cls(**d)

    def same_rope(self, other: "RopeSpec") -> bool:
        """True when both describe the same rope (``replace`` ignored; scale/base compared to rel 1e-9)."""
        a, b = self.to_dict(), other.to_dict()
        a.pop("replace"), b.pop("replace")
        for k in a:
            x, y = a[k], b[k]
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9):
                    return False
            elif x != y:
                return False
        return True

    def label(self, shown=()) -> str:
        """The one way a RoPE setting is written, in messages and in every report: ``none``, ``ntk x8``,
        ``abf x1 base=8e4``, ``yarn x8 a=0.1``. The method and scale always; a set base and YaRN fields off their
        defaults too; ``shown`` adds fields by name even at their defaults (``rope_base``, ``yarn_alpha``,
        ``yarn_beta``, ``yarn_mscale``, ``orig_ctx``, ``llama3_low``, ``llama3_high``): a report passes the
        fields that differ between the rows it shows, so two rows never read the same."""
        parts = ["none"] if self.method == "none" else [f"{self.method} x{_num(self.scale)}"]
        defaults = {f.name: f.default for f in fields(self)}
        for name, short in _LABEL_FIELDS:
            owner = name.split("_")[0]  # yarn_* belong to yarn, llama3_* to llama3
            if owner in ("yarn", "llama3") and self.method != owner or self.method == "none" and name != "rope_base":
                continue
            v = getattr(self, name)
            if name in shown or (v is not None and v != defaults[name] and name not in ("orig_ctx", "llama3_low",
                                                                                        "llama3_high")):
                parts.append(f"{short}={_num(v)}")
        return " ".join(parts)


_LABEL_FIELDS = (("rope_base", "base"), ("yarn_alpha", "a"), ("yarn_beta", "b"), ("yarn_mscale", "mscale"),
                 ("orig_ctx", "orig"), ("llama3_low", "low"), ("llama3_high", "high"))


def _num(v) -> str:
    """A number as a label writes it: 8, 0.1, 2.5, and bases as 8e4 / 5e5 / 1e6 (``%g`` otherwise)."""
    if v is None:
        return "none"
    v = float(v)
    if v >= 1e4 and v.is_integer():
        e = len(str(int(v))) - 1
        m = v / 10 ** e
        if round(m, 2) == m:
            return f"{m:g}e{e}"
    return f"{v:g}"
