"""RopeSpec: what RoPE setting to apply (or what a config carries), validated on construction."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from common.io import InputError

METHODS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "abf")  # what a user can ask for (--rope)
NATIVE_METHODS = ("llama3",)  # scaling a model ships with; read_rope reports it, apply_rope can write it back


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

    method: str = "none"
    scale: float = 1.0
    rope_base: float | None = None
    orig_ctx: int | None = None
    yarn_alpha: float = 1.0
    yarn_beta: float = 32.0
    yarn_mscale: float | None = None
    replace: bool = False
    llama3_low: float = 1.0
    llama3_high: float = 4.0

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
        if self.rope_base is not None and not (isinstance(self.rope_base, (int, float)) and self.rope_base > 1
                                               and math.isfinite(self.rope_base)):
            raise InputError(f"rope base must be a number > 1, got {self.rope_base!r}")
        if self.orig_ctx is not None and (not isinstance(self.orig_ctx, int) or isinstance(self.orig_ctx, bool)
                                          or self.orig_ctx < 1):
            raise InputError(f"original context must be a positive integer, got {self.orig_ctx!r}")
        if self.method == "yarn":
            if self.yarn_alpha <= 0:
                raise InputError(f"yarn alpha must be > 0, got {self.yarn_alpha:g}")
            if self.yarn_alpha >= self.yarn_beta:
                raise InputError(f"yarn alpha (slow, {self.yarn_alpha:g}) must be < yarn beta "
                                 f"(fast, {self.yarn_beta:g})")
            if self.yarn_mscale is not None and not (isinstance(self.yarn_mscale, (int, float))
                                                     and self.yarn_mscale > 0):
                raise InputError(f"yarn mscale must be a number > 0, got {self.yarn_mscale!r}")
        elif self.yarn_mscale is not None:
            raise InputError(f"--yarn-mscale only applies to --rope yarn, not {self.method}")
        if self.method == "abf" and self.rope_base is None:
            raise InputError("--rope abf needs --rope-base B (the new RoPE base)")
        if self.method == "none" and self.rope_base is not None:
            raise InputError("--rope-base with --rope none: use --rope abf --rope-base B to change the base only")
        if self.method == "none" and self.scale != 1:
            raise InputError(f"--scale {self.scale:g} with --rope none: pick a method (pi, ntk, dynamic_ntk, yarn)")
        if self.method == "llama3" and not 0 < self.llama3_low < self.llama3_high:
            raise InputError(f"llama3 needs 0 < low_freq_factor < high_freq_factor, got {self.llama3_low:g}, "
                             f"{self.llama3_high:g}")
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

    def describe(self) -> str:
        """Short human form, e.g. ``yarn s=16 (base 5e+06)``."""
        if self.method == "none":
            return "none"
        s = f"{self.method} s={self.scale:g}"
        if self.rope_base is not None:
            s += f" base={self.rope_base:g}"
        return s
