"""CNNSum subset presets (the paper's Sec 3.2 and Sec 4.2), in one place.

Sampling range of a subset with target T is [T - a, T + 2K] (K = 1024 tokens):
L = 16K [-4K], XL = 32K [-6K], 2XL = 64K [-10K], 3XL = 128K [-16K] (Sec 3.2).
Generation: greedy, at most 400 new tokens for L/XL and 500 for 2XL/3XL (Sec 4.2), at least 10 (not in the paper:
the official release's Inference.py, ``SamplingParams(min_tokens=10)``, github.com/CxsGhost/CNNSum at 994a7f9).
The official release names its files cnnsum_L_16k, cnnsum_XL_32k, cnnsum_XXL_64k, cnnsum_XXXL_128k.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .io import InputError

K = 1024


@dataclass(frozen=True)
class Subset:
    name: str  # L, XL, 2XL, 3XL
    target: int  # tokens
    below: int  # a: the range starts at target - below
    above: int  # the range ends at target + above (2K for every subset)
    max_new_tokens: int
    release_file: str

    @property
    def range(self) -> tuple[int, int]:
        return self.target - self.below, self.target + self.above


SUBSETS: dict[str, Subset] = {
    "L": Subset("L", 16 * K, 4 * K, 2 * K, 400, "cnnsum_L_16k"),
    "XL": Subset("XL", 32 * K, 6 * K, 2 * K, 400, "cnnsum_XL_32k"),
    "2XL": Subset("2XL", 64 * K, 10 * K, 2 * K, 500, "cnnsum_XXL_64k"),
    "3XL": Subset("3XL", 128 * K, 16 * K, 2 * K, 500, "cnnsum_XXXL_128k"),
}
ORDER = ("L", "XL", "2XL", "3XL")
MIN_NEW_TOKENS = 10  # the release's Inference.py (min_tokens=10); the paper gives only the maxima
_ALIASES = {"XXL": "2XL", "XXXL": "3XL"}


# the release's file names (cnnsum_XXL_64k.jsonl), the 2XL / 3XL spellings and names without the length
RELEASE_RE = re.compile(r"cnnsum_(L|XL|XXL|2XL|XXXL|3XL)(?:_\d+k)?\.(?:jsonl|parquet)", re.IGNORECASE)
_SCALED_RE = re.compile(r"[Tt](\d+)")  # T<tokens>: a scaled-down subset (scaled())


def get(name: str) -> Subset:
    key = _ALIASES.get(name.upper(), name.upper())
    if key not in SUBSETS:
        raise InputError(f"unknown subset {name!r} (choose from {', '.join(ORDER)})")
    return SUBSETS[key]


def scaled_tokens(name: str) -> int | None:
    """The token count of a scaled-down subset's name, T<tokens> (``T2048`` or ``t2048`` -> 2048); None for any
    other name. The one reader of that spelling."""
    m = _SCALED_RE.fullmatch(str(name).strip())
    return int(m.group(1)) if m else None


def parse(name: str, where: tuple = (None, None)) -> Subset:
    """L, XL, 2XL, 3XL (XXL, XXXL, any case) or T<tokens> (a scaled-down subset, e.g. T2048); an InputError
    naming ``where`` (file, line) otherwise."""
    tokens = scaled_tokens(name)
    if tokens is not None:
        if tokens < 1:
            raise InputError(f"subset {name!r}: T<tokens> needs a positive token count", *where)
        return scaled(tokens)
    try:
        return get(str(name).strip())
    except InputError as e:
        raise InputError(e.message + " or T<tokens>", *where) from None


def order_key(name: str) -> tuple:
    """Table order: L, XL, 2XL, 3XL, then scaled subsets T<n> by n, then anything else by name."""
    if name in ORDER:
        return (0, ORDER.index(name), "")
    tokens = scaled_tokens(name)
    if tokens is not None and name.startswith("T"):
        return (1, tokens, "")
    return (2, 0, name)


def from_filename(path: str | Path) -> Subset | None:
    """The subset a release file name implies (cnnsum_XXL_64k.jsonl, cnnsum_2XL.jsonl, or a name that starts like
    one, cnnsum_XL_32k_part2.jsonl -> its subset), or None."""
    name = Path(path).name
    m = RELEASE_RE.fullmatch(name) or re.search(r"cnnsum_(L|XL|XXL|XXXL|2XL|3XL)_", name, re.IGNORECASE)
    return get(m.group(1)) if m else None


def scaled(target: int, like: str = "L") -> Subset:
    """A subset scaled down to ``target`` tokens with the same relative range as ``like`` (for tiny models)."""
    base = get(like)
    f = target / base.target
    return Subset(f"T{target}", target, max(1, round(base.below * f)), max(1, round(base.above * f)),
                  base.max_new_tokens, "")
