"""Packing short summarization pairs into long training samples (CNNSum, arXiv 2412.02819, Sec 5 "Fine-tuning Data").

The paper concatenates ~9,000 novel-summarization pairs of 2K–4K tokens at random into samples of 14K–18K or
30K–34K tokens (average about 16K / 32K), rendering each pair with a fine-tuning prompt of Appendix F.2.

What a pair becomes (``encode_pairs``)::

    rendered prompt (ropescale.common.prompts.render(context, "ft-ib"|"ft-ie"))  + summary tokens + EOS
    labels:  -100 ... -100                                                   summary tokens + EOS

so the loss falls on the summaries only. How pairs become samples (``plan_packing``): the pairs are shuffled
with the seed and taken in that order. Each sample draws a length goal uniformly from [min, max] (seeded), grows
pair by pair and is closed once it reaches its goal, or once it is at least ``min`` long and the next pair would
push it past ``max`` or farther past the goal than it now falls short (that pair starts the next sample). So lengths
spread over the whole range and average about its middle, as the paper's "14k~18k ... with average lengths of about
16k" (Sec 5). A pair that would push a sample still below ``min`` past ``max`` waits in a pool and goes into the next
sample it fits. At the end the pairs still out (an unfinished last sample, the pool) are placed, best fit, into
finished samples that still have room below ``max``; what cannot be placed anywhere is reported as ``leftover`` (ids in
stats.json). A pair longer than ``max`` can never fit: ``--on-bad error`` stops with its file:line, ``skip`` counts it
as dropped. Samples have variable length inside [min, max] and carry no padding at all; every pair is used at most
once.

The output directory's format (train.parquet, meta.json, stats.json), its writer and its one reader are
``data_concat.packed``; the packing algorithm is ``data_concat.packing``; this module reads and encodes the pairs
and runs the command.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ropescale.common import prompts
from ropescale.common.cli import add_command, add_json, add_overwrite
from ropescale.common.io import InputError, check_output_dir, claim_output_dir, read_jsonl, sha256_file
from ropescale.common.settings import add_settings, check, from_args, make, setting

from .packed import FORMAT, FORMAT_VERSION, IGNORE_INDEX, compute_stats, format_stats, load_meta, write_packed
from .packing import Plan, build_columns, plan_packing

K = 1024
# Sec 5: "setting ranges to 14k~18k and 30k~34k" (k = 1024, as in Sec 3.2).
TARGETS: dict[str, tuple[int, int]] = {"16k": (14 * K, 18 * K), "32k": (30 * K, 34 * K)}
# --prompt: one of Appendix F.2's fine-tuning prompts (the names eval_summ uses for them), or "mix": a seeded coin
# flip per pair between the two (the default: the paper evaluates fine-tuned models with both F.2 prompts).
PROMPT_MODES = ("ft-ie", "ft-ib", "mix")
DEFAULT_PROMPT = "mix"
DEPRECATED_PROMPTS = {"ie": "ft-ie", "ib": "ft-ib"}  # old names of the F.2 prompts (ie/ib are F.1's baselines)
ON_BAD = ("error", "skip")


def parse_target(target) -> tuple[str, int, int]:
    """(name, min, max) of a --sample-length: 16k / 32k (the paper's ranges) or a token count N (a k suffix allowed)
    with the 16k preset's proportions, N x 7/8 .. N x 9/8."""
    key = str(target).strip().lower()
    if key in TARGETS:
        return key, *TARGETS[key]
    try:
        n = int(float(key[:-1]) * K) if key.endswith("k") else int(key)
    except ValueError:
        raise InputError(f"unknown --sample-length {target!r} (16k, 32k, or a token count)") from None
    if n <= 0:
        raise InputError(f"--sample-length must be positive, got {target}")
    return "custom", n * 7 // 8, n * 9 // 8


def resolve_range(target: str | int | None = None, min_tokens: int | None = None, max_tokens: int | None = None
                  ) -> tuple[str, int, int]:
    """(target name, min, max) from --sample-length and/or explicit --min-tokens / --max-tokens (which override
    it)."""
    lo = hi = None
    name = "custom"
    if target is not None:
        name, lo, hi = parse_target(target)
    if min_tokens is not None:
        lo = int(min_tokens)
    if max_tokens is not None:
        hi = int(max_tokens)
    if lo is None or hi is None:
        raise InputError("give --sample-length 16k, 32k or N, or both --min-tokens and --max-tokens")
    if lo <= 0 or hi < lo:
        raise InputError(f"bad length range [{lo}, {hi}]: need 0 < min <= max")
    if name != "custom" and (lo, hi) != TARGETS[name]:
        name = "custom"
    return name, lo, hi


@dataclass
class Pair:
    """One pair as read from the input: where it came from and its prompt type."""

    id: str
    context: str
    summary: str
    prompt: str  # ft-ib | ft-ie
    where: str  # FILE:LINE
    line: int = 0
    book: str | None = None


@dataclass
class EncodedPair:
    """A tokenized pair: ``prompt_ids`` get no loss, ``target_ids`` (summary + EOS) do."""

    id: str
    prompt_ids: np.ndarray
    target_ids: np.ndarray
    prompt: str = "ft-ib"
    where: str = ""

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.target_ids)


@dataclass
class BadRecords:
    """Input records that were skipped (``--on-bad skip``), by reason, with their FILE:LINE."""

    items: list[dict] = field(default_factory=list)

    def add(self, reason: str, err: InputError | str) -> None:
        self.items.append({"reason": reason, "where": _where(err), "message": getattr(err, "message", str(err))})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.items:
            out[it["reason"]] = out.get(it["reason"], 0) + 1
        return out


def _where(err) -> str:
    if isinstance(err, InputError) and err.path is not None:
        return f"{err.path}:{err.line}" if err.line is not None else err.path
    return ""


def _check_on_bad(on_bad: str) -> None:
    if on_bad not in ON_BAD:
        raise InputError(f"unknown --on-bad {on_bad!r} (choose from {', '.join(ON_BAD)})")


def canonical_prompt(mode: str, *, warn: bool = False) -> str:
    """The canonical --prompt name: ft-ie, ft-ib or mix. The deprecated aliases ie / ib map to ft-ie / ft-ib
    (with a note on stderr when ``warn``); anything else is an InputError."""
    key = str(mode).strip().lower()
    if key in DEPRECATED_PROMPTS:
        canon = DEPRECATED_PROMPTS[key]
        if warn:
            print(f"note: --prompt {key} is deprecated, use {canon} (the Appendix F.2 prompt it always meant; "
                  f"{key} names the F.1 baseline prompt in eval_summ)", file=sys.stderr)
        return canon
    if key not in PROMPT_MODES:
        raise InputError(f"unknown --prompt {mode!r} (choose from {', '.join(PROMPT_MODES)})")
    return key


def choose_prompt(mode: str, n: int, seed: int) -> list[str]:
    """Prompt type of each of ``n`` pairs: all ft-ib, all ft-ie, or (mix) a seeded coin flip per pair."""
    mode = canonical_prompt(mode)
    if mode == "mix":
        rng = random.Random(seed * 1_000_003 + 17)  # independent of the packing order's stream
        return ["ft-ib" if rng.random() < 0.5 else "ft-ie" for _ in range(n)]
    return [mode] * n


def read_pairs(path: str | os.PathLike, *, prompt: str = DEFAULT_PROMPT, seed: int = 0, on_bad: str = "error",
               bad: BadRecords | None = None) -> list[Pair]:
    """Pairs ``{context, summary[, id, book]}`` from a JSONL file, validated (bad lines: error or counted skip)."""
    _check_on_bad(on_bad)
    bad = bad if bad is not None else BadRecords()
    path = Path(path)
    skip = on_bad == "skip"
    rows: list[dict] = []
    seen: set[str] = set()
    for obj in read_jsonl(path, required=("context", "summary"), skip_bad=skip,
                          on_skip=lambda e: bad.add("malformed", e)):
        line = obj["_line"]
        try:
            for k in ("context", "summary"):
                if not isinstance(obj[k], str) or not obj[k].strip():
                    raise InputError(f"empty or non-string {k!r}", path, line)
            pid = str(obj["id"]) if obj.get("id") is not None else f"{path.name}:{line}"
            if pid in seen:
                raise InputError(f"duplicate id {pid!r}", path, line)
        except InputError as e:
            if not skip:
                raise
            bad.add("duplicate_id" if "duplicate" in e.message else "empty", e)
            continue
        seen.add(pid)
        rows.append(dict(obj, _id=pid))
    if not rows:
        raise InputError("no pairs" + (f" ({len(bad.items)} bad line(s) skipped)" if bad.items else " (empty file)"),
                         path)
    kinds = choose_prompt(prompt, len(rows), seed)
    return [Pair(id=r["_id"], context=r["context"], summary=r["summary"], prompt=k, where=f"{path}:{r['_line']}",
                 line=r["_line"], book=r.get("book")) for r, k in zip(rows, kinds)]


def encode_pairs(pairs: Sequence[Pair], tok, *, batch_size: int = 64, progress: bool = False) -> list[EncodedPair]:
    """Tokenize each pair: the rendered F.2 prompt (no loss) and the summary + EOS (loss)."""
    from .tokenizer import encode_batch

    eos = tok.eos_token_id
    out: list[EncodedPair] = []
    bar = _bar(len(pairs), "tokenizing pairs", progress)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        p_ids = encode_batch(tok, [prompts.render(p.context, p.prompt) for p in chunk])
        s_ids = encode_batch(tok, [p.summary for p in chunk])
        for p, a, b in zip(chunk, p_ids, s_ids):
            out.append(EncodedPair(p.id, np.asarray(a, dtype=np.int32), np.asarray(b + [eos], dtype=np.int32),
                                   p.prompt, p.where))
        bar.update(len(chunk))
    bar.close()
    return out


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pair", disable=not enabled, file=sys.stderr, leave=False)


def pack_encoded(encoded: Sequence[EncodedPair], lo: int, hi: int, seed: int, *, on_bad: str = "error",
                 bad: BadRecords | None = None) -> tuple[dict, Plan]:
    """Plan and build the columns; a pair longer than ``hi`` is an error (naming its FILE:LINE) or a counted skip."""
    _check_on_bad(on_bad)
    plan = plan_packing([len(e) for e in encoded], lo, hi, seed)
    if plan.too_long:
        first = encoded[plan.too_long[0]]
        msg = f"pair {first.id!r} is {len(first)} tokens, longer than the maximum sample length {hi}"
        if on_bad == "error":
            path, _, line = first.where.rpartition(":")
            raise InputError(msg, path or None, int(line) if line.isdigit() else None) if path else InputError(msg)
        if bad is not None:
            for i in plan.too_long:
                e = encoded[i]
                bad.items.append({"reason": "too_long", "where": e.where,
                                  "message": f"pair {e.id!r} is {len(e)} tokens > max {hi}"})
    return build_columns(encoded, plan), plan


@dataclass(frozen=True)
class PackSettings:
    """Every setting of ``data_concat pack`` (its flags, a --recipe, meta.json)."""

    pairs: str | None = setting(None, "JSONL of {context, summary[, id, book]}", metavar="FILE", required=True)
    tokenizer: str = setting("tiny", "tokenizer directory (an HF model dir works), or 'tiny' for the embedded tiny "
                                     "default")
    out: str | None = setting(None, "output directory (replaced atomically); datasets.load_dataset(OUT, "
                                    "split='train') reads it", metavar="DIR", required=True)
    sample_length: str | None = setting(None, "length of a training sample: 16k (14K-18K tokens) or 32k (30K-34K), "
                                              "the paper's ranges, or a token count N (N x 7/8 to N x 9/8)",
                                        metavar="LENGTH", aliases=("--target",))
    min_tokens: int | None = setting(None, "minimum sample length in tokens (overrides --sample-length)",
                                     aliases=("--min",), check=(lambda v: v > 0, "positive"), metavar="N")
    max_tokens: int | None = setting(None, "maximum sample length in tokens (overrides --sample-length)",
                                     aliases=("--max",),
                                     check=(lambda v: v > 0, "positive"), metavar="N")
    prompt: str = setting(DEFAULT_PROMPT, "Appendix F.2 fine-tuning prompt (the names eval_summ uses): ft-ie, ft-ib, "
                                          "or mix (a seeded random choice per pair: the paper evaluates fine-tuned "
                                          "models with both); ie / ib are deprecated aliases of ft-ie / ft-ib",
                          choices=PROMPT_MODES + tuple(DEPRECATED_PROMPTS))
    seed: int = setting(0, "seed of the random concatenation")
    on_bad: str = setting("error", "malformed or empty records (and pairs longer than the maximum): stop with "
                                   "FILE:LINE (error) or skip and count them (skip)", choices=ON_BAD)


def pack(settings: PackSettings | str | os.PathLike | None = None, *args, progress: bool = False,
         log: Callable[[str], None] | None = None, **fields) -> dict:
    """Read, tokenize and pack pairs into OUT (see module doc); returns the stats (also in OUT/stats.json).
    ``pack(PackSettings(...))`` or ``pack(pairs, tokenizer, out, min_tokens=..., max_tokens=..., ...)``."""
    from .tokenizer import load_tokenizer, resolve_tokenizer_dir

    if not isinstance(settings, PackSettings):
        fields.update(zip(("pairs", "tokenizer", "out"), (settings,) + args))
        settings = make(PackSettings, **{k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in fields.items()})
    check(settings)
    st = settings
    name, lo, hi = resolve_range(st.sample_length, st.min_tokens, st.max_tokens)
    prompt = canonical_prompt(st.prompt, warn=True)
    seed, on_bad, out = st.seed, st.on_bad, st.out
    check_output_dir(out)
    t0 = time.time()
    bad = BadRecords()
    pairs_path = Path(st.pairs)
    plist = read_pairs(pairs_path, prompt=prompt, seed=seed, on_bad=on_bad, bad=bad)
    tok_dir = resolve_tokenizer_dir(st.tokenizer)
    tok = load_tokenizer(tok_dir)
    encoded = encode_pairs(plist, tok, progress=progress)
    cols, plan = pack_encoded(encoded, lo, hi, seed, on_bad=on_bad, bad=bad)
    used = sum(len(s) for s in plan.samples)
    offsets = np.concatenate([[0], np.cumsum(cols["length"])])
    sup = [int((cols["labels"][a:b] != IGNORE_INDEX).sum()) for a, b in zip(offsets[:-1], offsets[1:])]
    stats = compute_stats(cols["length"].tolist(), sup, [len(s) for s in plan.samples], lo, hi)
    stats.update({
        "pairs_read": len(plist),
        "pairs_used": used,
        "dropped": len(bad.items),
        "dropped_by_reason": bad.counts(),
        "dropped_records": bad.items,
        "leftover": len(plan.leftover),
        "leftover_ids": [encoded[i].id for i in plan.leftover],
        "leftover_tokens": int(sum(len(encoded[i]) for i in plan.leftover)),
        "pair_token_share_used": round(sum(len(encoded[i]) for s in plan.samples for i in s)
                                       / max(1, sum(len(e) for e in encoded)), 5),
        "seconds": round(time.time() - t0, 2),
    })
    prompt_counts: dict[str, int] = {}
    for s in plan.samples:
        for i in s:
            prompt_counts[encoded[i].prompt] = prompt_counts.get(encoded[i].prompt, 0) + 1
    stats["prompt"] = prompt
    stats["prompt_types"] = prompt_counts
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "tokenizer": str(tok_dir), "tokenizer_arg": str(st.tokenizer), "eos_token_id": int(tok.eos_token_id),
        "target": name, "min": lo, "max": hi, "prompt": prompt, "prompt_types": prompt_counts,
        "seed": seed, "on_bad": on_bad, "pairs": str(pairs_path), "pairs_sha256": sha256_file(pairs_path),
        "counts": {"pairs_read": len(plist), "pairs_used": used, "samples": len(plan.samples),
                   "dropped": len(bad.items), "leftover": len(plan.leftover)},
        "ignore_index": IGNORE_INDEX,
    }
    write_packed(out, cols, meta, stats)
    return stats


# ---------------------------------------------------------------- CLI
EPILOG = """\
Each pair {context, summary[, id, book]} becomes: the Appendix F.2 prompt rendered around the context (no loss),
then the summary tokens and EOS (loss). Pairs are shuffled with --seed and concatenated into samples whose
length lies in [min, max] (16k = 14336-18432, 32k = 30720-34816 tokens); samples are not padded. Pairs that
do not fit anywhere are reported as leftover; bad records stop the run (--on-bad error) or are counted
(--on-bad skip). OUT (replaced atomically) holds train.parquet, meta.json and stats.json."""


def register(sub) -> None:
    p = add_command(sub, "pack", help="pack summarization pairs into long training samples",
                    description="Pack summarization pairs into 14-18K / 30-34K token training samples (CNNSum Sec 5).",
                    epilog=EPILOG)
    add_settings(p, PackSettings)
    add_json(p, "the stats")
    add_overwrite(p)
    p.set_defaults(func=cmd_pack)


def cmd_pack(args: argparse.Namespace) -> int:
    settings = from_args(args, PackSettings)
    claim_output_dir(settings.out, overwrite=args.overwrite)
    stats = pack(settings, progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
    else:
        print(format_stats(stats, load_meta(settings.out)))
        print(f"wrote {settings.out}")
    if stats["samples"] == 0:
        print(f"warning: no sample reached the minimum length; {stats['leftover']} pair(s) left over",
              file=sys.stderr)
    return 0
