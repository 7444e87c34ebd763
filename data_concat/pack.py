"""Packing short summarization pairs into long training samples (CNNSum, arXiv 2412.02819, Sec 5 "Fine-tuning Data").

The paper concatenates ~9,000 novel-summarization pairs of 2K–4K tokens at random into samples of 14K–18K or
30K–34K tokens (average about 16K / 32K), rendering each pair with a fine-tuning prompt of Appendix F.2.

What a pair becomes (``encode_pairs``)::

    rendered prompt (common.prompts.render(context, "ft-ib"|"ft-ie"))  + summary tokens + EOS
    labels:  -100 ... -100                                                   summary tokens + EOS

so the loss falls on the summaries only. How pairs become samples (``plan_packing``): the pairs are shuffled
with the seed and taken in that order. Each sample draws a length goal uniformly from [min, max] (seeded), grows
pair by pair and is closed once it reaches its goal, or once it is at least ``min`` long and the next pair would
push it past ``max`` or farther past the goal than it now falls short (that pair starts the next sample). So lengths spread over the whole range and average
about its middle, as the paper's "14k~18k ... with average lengths of about 16k" (Sec 5). A pair that would push
a sample still below ``min`` past ``max`` waits in a pool and goes into the next sample it fits. At the end the
pairs still out (an unfinished last sample, the pool) are placed, best fit, into finished samples that still
have room below ``max``; what cannot be placed anywhere is reported as ``leftover`` (ids in
stats.json). A pair longer than ``max`` can never fit: ``--on-bad error`` stops with its file:line, ``skip``
counts it as dropped. Samples have variable length inside [min, max] and carry no padding at all; every pair
is used at most once.

Output directory (written to a temp dir beside OUT, then renamed into place)::

    OUT/train.parquet  input_ids list<int32>, labels list<int32> (-100 = no loss), pair_starts list<int32>
                       (offset of each pair in the sample), pair_ids list<string>, length int32
    OUT/meta.json      tokenizer, target, min/max, prompt, seed, counts
    OUT/stats.json     length histogram, pairs per sample, supervised-token share, dropped and leftover ids

Hugging Face ``datasets`` reads OUT as it is: ``load_dataset(str(OUT), split="train")`` (the file name
``train.parquet`` names the split; meta.json / stats.json are not data) or
``load_dataset("parquet", data_files=str(OUT / "train.parquet"), split="train")``.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from common import prompts
from common.io import InputError, atomic_dir, check_output_dir, read_jsonl, sha256_file, write_json_atomic

K = 1024
# Sec 5: "setting ranges to 14k~18k and 30k~34k" (k = 1024, as in Sec 3.2).
TARGETS: dict[str, tuple[int, int]] = {"16k": (14 * K, 18 * K), "32k": (30 * K, 34 * K)}
# --prompt: one of Appendix F.2's fine-tuning prompts (the names eval_summ uses for them), or "mix": a seeded coin
# flip per pair between the two (the default: the paper evaluates fine-tuned models with both F.2 prompts).
PROMPT_MODES = ("ft-ie", "ft-ib", "mix")
DEFAULT_PROMPT = "mix"
DEPRECATED_PROMPTS = {"ie": "ft-ie", "ib": "ft-ib"}  # old names of the F.2 prompts (ie/ib are F.1's baselines)
IGNORE_INDEX = -100
FORMAT_VERSION = 1
ON_BAD = ("error", "skip")


def resolve_range(target: str | None = None, min_len: int | None = None, max_len: int | None = None
                  ) -> tuple[str, int, int]:
    """(target name, min, max) from a preset (16k / 32k) and/or explicit --min/--max (which override it)."""
    lo = hi = None
    name = "custom"
    if target is not None:
        key = str(target).lower()
        if key not in TARGETS:
            raise InputError(f"unknown --target {target!r} (choose from {', '.join(TARGETS)}, or give --min/--max)")
        name = key
        lo, hi = TARGETS[key]
    if min_len is not None:
        lo = int(min_len)
    if max_len is not None:
        hi = int(max_len)
    if lo is None or hi is None:
        raise InputError("give --target 16k|32k or both --min and --max")
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


@dataclass
class Plan:
    """Which pairs (indices into the encoded list) make each sample, and what was left out."""

    samples: list[list[int]]
    leftover: list[int]
    too_long: list[int]


def plan_packing(lengths: Sequence[int], lo: int, hi: int, seed: int) -> Plan:
    """Random concatenation into samples of length in [lo, hi] (Sec 5), each pair at most once (see module doc)."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    samples: list[list[int]] = []
    totals: list[int] = []
    too_long: list[int] = []
    pool: list[int] = []  # pairs that did not fit an open sample still below lo, in arrival order
    cur: list[int] = []
    total = 0
    goal = rng.randint(lo, hi)  # this sample's length goal, uniform in [lo, hi]

    def close():
        nonlocal cur, total, goal
        samples.append(cur)
        totals.append(total)
        cur, total, goal = [], 0, rng.randint(lo, hi)

    def add(i):
        nonlocal total
        cur.append(i)
        total += lengths[i]
        if total >= goal:
            close()
            refill()

    def refill():
        k = 0
        while k < len(pool):
            j = pool[k]
            if total + lengths[j] <= hi:
                pool.pop(k)
                add(j)  # may close the sample and refill the next one from the pool
                k = 0
            else:
                k += 1

    for i in order:
        n = lengths[i]
        if n > hi:
            too_long.append(i)
            continue
        # Close a sample that is long enough when the pair does not fit, or would land it farther past its
        # goal than it now is short of it (so lengths centre on the goals, not above them).
        if total >= lo and (total + n > hi or total + n - goal > goal - total):
            close()
            refill()
        if total + n <= hi:
            add(i)
        else:
            pool.append(i)
    if total >= lo:
        close()
    # Place what is still out into finished samples with room (best fit: the least room that suffices).
    rest = cur + pool
    leftover: list[int] = []
    for i in sorted(rest, key=lambda j: -lengths[j]):
        n = lengths[i]
        best, best_room = -1, None
        for s, t in enumerate(totals):
            room = hi - t
            if room >= n and (best_room is None or room < best_room):
                best, best_room = s, room
        if best < 0:
            leftover.append(i)
        else:
            samples[best].append(i)
            totals[best] += n
    rank = {i: k for k, i in enumerate(order)}
    return Plan(samples, sorted(leftover, key=rank.__getitem__), too_long)


def build_columns(encoded: Sequence[EncodedPair], plan: Plan) -> dict:
    """Flat numpy columns (values + offsets) for the samples of ``plan``."""
    ids_parts, lab_parts, lengths, starts, pids = [], [], [], [], []
    for members in plan.samples:
        pos = 0
        st = []
        for i in members:
            e = encoded[i]
            st.append(pos)
            ids_parts += [e.prompt_ids, e.target_ids]
            lab_parts += [np.full(len(e.prompt_ids), IGNORE_INDEX, dtype=np.int32), e.target_ids]
            pos += len(e)
        lengths.append(pos)
        starts.append(st)
        pids.append([encoded[i].id for i in members])
    values = np.concatenate(ids_parts).astype(np.int32) if ids_parts else np.zeros(0, np.int32)
    labels = np.concatenate(lab_parts).astype(np.int32) if lab_parts else np.zeros(0, np.int32)
    return {"input_ids": values, "labels": labels, "length": np.asarray(lengths, dtype=np.int32),
            "pair_starts": starts, "pair_ids": pids}


def _table(cols: dict):
    import pyarrow as pa

    lengths = cols["length"]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    off = pa.array(offsets, type=pa.int32())
    return pa.table({
        "input_ids": pa.ListArray.from_arrays(off, pa.array(cols["input_ids"], type=pa.int32())),
        "labels": pa.ListArray.from_arrays(off, pa.array(cols["labels"], type=pa.int32())),
        "pair_starts": pa.array(cols["pair_starts"], type=pa.list_(pa.int32())),
        "pair_ids": pa.array(cols["pair_ids"], type=pa.list_(pa.string())),
        "length": pa.array(lengths, type=pa.int32()),
    })


def histogram(values: Sequence[int], lo: int, hi: int, bins: int = 8) -> list[dict]:
    """Counts of ``values`` in ``bins`` equal-width bins covering [lo, hi] (last bin closed)."""
    width = max(1, -(-(hi - lo + 1) // bins))
    edges = list(range(lo, hi + 1, width))
    out = [{"from": a, "to": min(a + width - 1, hi), "count": 0} for a in edges]
    for v in values:
        k = min(max((v - lo) // width, 0), len(out) - 1)
        out[k]["count"] += 1
    return out


def compute_stats(lengths: Sequence[int], supervised: Sequence[int], pairs_per_sample: Sequence[int], lo: int,
                  hi: int) -> dict:
    """Summary numbers of a packed set (the same for ``pack`` and ``stats``)."""
    n = len(lengths)
    tot = int(sum(lengths))
    sup = int(sum(supervised))
    pps = list(pairs_per_sample)
    return {
        "samples": n,
        "tokens": tot,
        "length": {"min": min(lengths, default=0), "mean": round(tot / n, 1) if n else 0.0,
                   "max": max(lengths, default=0), "histogram": histogram(lengths, lo, hi)},
        "pairs_per_sample": {"min": min(pps, default=0), "mean": round(sum(pps) / n, 2) if n else 0.0,
                             "max": max(pps, default=0),
                             "counts": {str(k): pps.count(k) for k in sorted(set(pps))}},
        "supervised_tokens": sup,
        "supervised_share": round(sup / tot, 5) if tot else 0.0,
        # Samples are stored unpadded: every stored token is real. If a trainer pads a batch to `max`,
        # this share of the padded tokens is real:
        "real_share": 1.0 if n else 0.0,
        "real_share_if_padded_to_max": round(tot / (n * hi), 5) if n else 0.0,
    }


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pair", disable=not enabled, file=sys.stderr, leave=False)


def write_packed(out: str | os.PathLike, cols: dict, meta: dict, stats: dict) -> Path:
    """Write OUT/{train.parquet, meta.json, stats.json} into a temp dir beside OUT, then rename it into place
    (an existing OUT is replaced only after the new one is complete)."""
    import pyarrow.parquet as pq

    with atomic_dir(out) as tmp:
        pq.write_table(_table(cols), tmp / "train.parquet")
        write_json_atomic(tmp / "meta.json", meta)
        write_json_atomic(tmp / "stats.json", stats)
    return Path(out)


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


def pack(pairs: str | os.PathLike, tokenizer: str | os.PathLike, out: str | os.PathLike, *, target: str | None = None,
         min_len: int | None = None, max_len: int | None = None, prompt: str = DEFAULT_PROMPT, seed: int = 0,
         on_bad: str = "error", progress: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Read, tokenize and pack ``pairs`` into OUT (see module doc). Returns stats (also in OUT/stats.json)."""
    from .tokenizer import load_tokenizer, resolve_tokenizer_dir

    name, lo, hi = resolve_range(target, min_len, max_len)
    _check_on_bad(on_bad)
    prompt = canonical_prompt(prompt, warn=True)
    check_output_dir(out)
    t0 = time.time()
    bad = BadRecords()
    pairs_path = Path(pairs)
    plist = read_pairs(pairs_path, prompt=prompt, seed=seed, on_bad=on_bad, bad=bad)
    tok_dir = resolve_tokenizer_dir(tokenizer)
    tok = load_tokenizer(tok_dir)
    encoded = encode_pairs(plist, tok, progress=progress)
    cols, plan = pack_encoded(encoded, lo, hi, seed, on_bad=on_bad, bad=bad)
    used = sum(len(s) for s in plan.samples)
    sup = [int((cols["labels"][a:b] != IGNORE_INDEX).sum()) for a, b in _spans(cols["length"])]
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
        "format": "ropescale-packed", "format_version": FORMAT_VERSION,
        "tokenizer": str(tok_dir), "tokenizer_arg": str(tokenizer), "eos_token_id": int(tok.eos_token_id),
        "target": name, "min": lo, "max": hi, "prompt": prompt, "prompt_types": prompt_counts,
        "seed": seed, "on_bad": on_bad, "pairs": str(pairs_path), "pairs_sha256": sha256_file(pairs_path),
        "counts": {"pairs_read": len(plist), "pairs_used": used, "samples": len(plan.samples),
                   "dropped": len(bad.items), "leftover": len(plan.leftover)},
        "ignore_index": IGNORE_INDEX,
    }
    write_packed(out, cols, meta, stats)
    return stats


def _spans(lengths: Iterable[int]):
    a = 0
    for n in lengths:
        yield a, a + int(n)
        a += int(n)


def load_packed(out: str | os.PathLike) -> list[dict]:
    """The rows of a packed dataset: [{input_ids, labels, pair_starts, pair_ids, length}] (plain Python lists)."""
    import pyarrow.parquet as pq

    out = Path(out)
    f = out / "train.parquet"
    if not f.is_file():
        raise InputError("not a packed dataset (no train.parquet)", out)
    return pq.read_table(f).to_pylist()


def load_meta(out: str | os.PathLike) -> dict:
    """OUT/meta.json of a packed dataset."""
    f = Path(out) / "meta.json"
    if not f.is_file():
        raise InputError("not a packed dataset (no meta.json)", Path(out))
    return json.loads(f.read_text(encoding="utf-8"))


def stats_of(out: str | os.PathLike) -> dict:
    """Recompute the summary numbers of an existing packed dataset from its rows (plus its recorded counts)."""
    import pyarrow.parquet as pq

    out = Path(out)
    meta = load_meta(out)
    f = out / "train.parquet"
    if not f.is_file():
        raise InputError("not a packed dataset (no train.parquet)", out)
    t = pq.read_table(f, columns=["labels", "pair_ids", "length"])
    lengths = t.column("length").to_pylist()
    labels = t.column("labels").combine_chunks()
    flat = labels.flatten().to_numpy()
    sup = [int((flat[a:b] != IGNORE_INDEX).sum()) for a, b in _spans(lengths)]
    pps = [len(x) for x in t.column("pair_ids").to_pylist()]
    stats = compute_stats(lengths, sup, pps, meta["min"], meta["max"])
    recorded = {}
    sf = out / "stats.json"
    if sf.is_file():
        recorded = json.loads(sf.read_text(encoding="utf-8"))
    for k in ("pairs_read", "pairs_used", "dropped", "dropped_by_reason", "leftover", "leftover_ids",
              "leftover_tokens", "pair_token_share_used"):
        if k in recorded:
            stats[k] = recorded[k]
    stats["pairs_used"] = sum(pps)
    if "prompt" in meta:
        stats["prompt"] = meta["prompt"]
    if "prompt_types" in meta:
        stats["prompt_types"] = meta["prompt_types"]
    return stats


def format_stats(stats: dict, meta: dict | None = None) -> str:
    """Human-readable summary (stdout of ``pack`` and ``stats``)."""
    lines = []
    if meta:
        lines.append(f"packed: target {meta.get('target')} [{meta.get('min')}, {meta.get('max')}] tokens, "
                     f"prompt {meta.get('prompt')}, seed {meta.get('seed')}, tokenizer {meta.get('tokenizer')}")
    L = stats["length"]
    lines.append(f"samples: {stats['samples']}   tokens: {stats['tokens']}   "
                 f"length min/mean/max: {L['min']} / {L['mean']} / {L['max']}")
    peak = max([b["count"] for b in L["histogram"]] + [1])
    for b in L["histogram"]:
        bar = "#" * round(40 * b["count"] / peak)
        lines.append(f"  {b['from']:>7}-{b['to']:<7} {b['count']:>6} {bar}")
    P = stats["pairs_per_sample"]
    lines.append(f"pairs per sample min/mean/max: {P['min']} / {P['mean']} / {P['max']}   "
                 f"counts: {json.dumps(P['counts'])}")
    lines.append(f"supervised tokens: {stats['supervised_tokens']} ({100 * stats['supervised_share']:.2f}%)   "
                 f"real (non-padding) tokens: {100 * stats['real_share']:.2f}% "
                 f"({100 * stats['real_share_if_padded_to_max']:.2f}% if padded to max)")
    if "pairs_read" in stats:
        lines.append(f"pairs read: {stats['pairs_read']}   used: {stats['pairs_used']}   "
                     f"dropped: {stats.get('dropped', 0)} {json.dumps(stats.get('dropped_by_reason', {}))}   "
                     f"leftover: {stats.get('leftover', 0)} ({stats.get('leftover_tokens', 0)} tokens)")
    return "\n".join(lines)
