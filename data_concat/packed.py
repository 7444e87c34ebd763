"""The packed-set format (what ``data_concat pack`` writes and finetune trains on) -- its one writer and one reader.

    OUT/train.parquet  input_ids list<int32>, labels list<int32> (-100 = no loss), pair_starts list<int32>
                       (offset of each pair in the sample), pair_ids list<string>, length int32
    OUT/meta.json      tokenizer, target, min/max, prompt, seed, counts
    OUT/stats.json     length histogram, pairs per sample, supervised-token share, dropped and leftover ids

:func:`write_packed` writes a directory atomically (``ropescale.common.io.atomic_dir``); :func:`read_packed` reads it
into a :class:`PackedSet` (two flat int32 arrays + offsets: a 16K x 1,000-sample set stays ~130 MB per process), which
training, ``stats`` and the tests all use. Hugging Face ``datasets`` reads OUT as it is: ``load_dataset(str(OUT),
split="train")``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ropescale.common.io import InputError, atomic_dir, write_json_atomic

IGNORE_INDEX = -100
FORMAT = "ropescale-packed"
FORMAT_VERSION = 1
TRAIN_FILE = "train.parquet"


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


def write_packed(out: str | os.PathLike, cols: dict, meta: dict, stats: dict) -> Path:
    """Write OUT/{train.parquet, meta.json, stats.json} into a temp dir beside OUT, then rename it into place
    (an existing OUT is replaced only after the new one is complete)."""
    import pyarrow.parquet as pq

    with atomic_dir(out) as tmp:
        pq.write_table(_table(cols), tmp / TRAIN_FILE)
        write_json_atomic(tmp / "meta.json", meta)
        write_json_atomic(tmp / "stats.json", stats)
    return Path(out)


class PackedSet:
    """A packed dataset as read: ``input_ids`` / ``labels`` (flat int32 arrays), ``offsets`` (sample i is
    ``offsets[i]:offsets[i+1]``), the Parquet table (for the other columns) and the directory (meta.json,
    stats.json)."""

    def __init__(self, path: Path, input_ids, labels, offsets, table):
        self.path, self.input_ids, self.labels, self.offsets, self.table = Path(path), input_ids, labels, offsets, table

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self):
        return np.diff(self.offsets)

    def row(self, i: int) -> tuple:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[a:b], self.labels[a:b]

    def pair_starts(self) -> list | None:
        """Where each pair starts in each sample (int64 arrays, ``pair_starts[i][k]`` = the offset of pair k of
        sample i), or None when the set has no pair boundaries (the column absent, or not read)."""
        if "pair_starts" not in self.table.column_names:
            return None
        col = self.table.column("pair_starts").combine_chunks()
        off = np.asarray(col.offsets, dtype=np.int64)
        flat = np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.int64)
        return [flat[a:b] for a, b in zip(off[:-1], off[1:])]

    def supervised(self) -> list[int]:
        """Labelled tokens per sample."""
        lab = self.labels != IGNORE_INDEX
        return [int(lab[a:b].sum()) for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def rows(self) -> list[dict]:
        """Every sample as plain Python lists: {input_ids, labels, pair_starts, pair_ids, length} (the columns read)."""
        return self.table.to_pylist()

    @property
    def meta(self) -> dict:
        return load_meta(self.path)


def read_packed(out: str | os.PathLike, columns: Sequence[str] | None = None,
                optional: Sequence[str] = ()) -> PackedSet:
    """The packed dataset in ``out`` (``columns``: read only these, e.g. input_ids + labels for training; ``optional``:
    these too where the file has them, e.g. ``pair_starts``, absent from sets written by hand). Not a packed dataset,
    an unreadable file or samples whose input_ids and labels differ in length are InputErrors."""
    import pyarrow.parquet as pq

    d = Path(out)
    f = d / TRAIN_FILE
    if not f.is_file():
        raise InputError("not a packed dataset (no train.parquet; build one with python -m data_concat pack)", d)
    try:
        if columns and optional:
            names = set(pq.read_schema(f).names)
            columns = list(columns) + [c for c in optional if c in names and c not in columns]
        t = pq.read_table(f, columns=list(columns) if columns else None)
    except Exception as e:  # pyarrow raises many types for a bad file
        raise InputError(f"unreadable packed dataset: {e}", f) from None
    if t.num_rows == 0:
        return PackedSet(d, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64), t)
    ids_col = t.column("input_ids").combine_chunks()
    lab_col = t.column("labels").combine_chunks()
    off = np.asarray(ids_col.offsets, dtype=np.int64)
    if not np.array_equal(off, np.asarray(lab_col.offsets, dtype=np.int64)):
        raise InputError("input_ids and labels differ in length in some sample", f)
    ids = np.asarray(ids_col.values.to_numpy(zero_copy_only=False), dtype=np.int32)
    labels = np.asarray(lab_col.values.to_numpy(zero_copy_only=False), dtype=np.int32)
    ids, labels = ids[off[0]:off[-1]], labels[off[0]:off[-1]]
    return PackedSet(d, ids, labels, off - off[0], t)


def load_packed(out: str | os.PathLike) -> list[dict]:
    """The rows of a packed dataset: [{input_ids, labels, pair_starts, pair_ids, length}] (plain Python lists)."""
    return read_packed(out).rows()


def load_meta(out: str | os.PathLike) -> dict:
    """OUT/meta.json of a packed dataset."""
    f = Path(out) / "meta.json"
    if not f.is_file():
        raise InputError("not a packed dataset (no meta.json)", Path(out))
    return json.loads(f.read_text(encoding="utf-8"))


def stats_of(out: str | os.PathLike) -> dict:
    """Recompute the summary numbers of an existing packed dataset from its rows (plus its recorded counts)."""
    out = Path(out)
    meta = load_meta(out)
    ps = read_packed(out, columns=["input_ids", "labels", "pair_ids"])
    pps = [len(x) for x in ps.table.column("pair_ids").to_pylist()]
    stats = compute_stats(ps.lengths().tolist(), ps.supervised(), pps, meta["min"], meta["max"])
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


def register(sub) -> None:
    from ropescale.common.cli import add_command, add_json

    p = add_command(sub, "stats", help="print the stats of a packed directory")
    p.add_argument("out", metavar="DIR", help="a directory written by pack")
    add_json(p, "the stats")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args) -> int:
    stats = stats_of(args.out)
    print(json.dumps(stats, ensure_ascii=False) if args.json else format_stats(stats, load_meta(args.out)))
    return 0
