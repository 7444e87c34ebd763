"""What every probe shares: model loading with the rope flags, the common CLI flags, and the run directory.

A probe run directory has the same shape as generation's (common.runs): ``run.json`` (kind "probe", probe name,
model, rope spec dict, scale, lengths, seed, args, versions), ``items.jsonl`` (one record per scored item, each with
``id``, ``group``, ``col`` and ``value``: the report's row group, column bucket and cell metric) and
``summary.json`` (the cells: mean value and count per group x column). Re-running into the same directory with the
same settings resumes: items already in ``items.jsonl`` are skipped. The directory and its run.json are written
with the first result: a run that fails before producing one (bad lengths, too-short data, ...) leaves nothing
behind, so the corrected command can use the same ``--out``.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from common.paths import CHAPTERS_JSONL
from common.io import InputError, check_output_dir
from common.runs import RunDir, now

ITEMS = "items.jsonl"
SUMMARY = "summary.json"


# ---------------------------------------------------------------- model
@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    path: Path
    name: str  # what the user passed (``tiny`` or a path)
    rope: dict  # the effective rope spec dict (read back from the config after applying the flags)
    scale: float
    orig_ctx: int
    context: int  # the context the (scaled) config is meant for

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        for v in (t.pad_token_id, t.eos_token_id, 0):
            if v is not None:
                return int(v)
        return 0


def load_model(name: str | os.PathLike | None, spec=None) -> Loaded:
    """Resolve ``name`` (``tiny`` or an HF model dir), apply the rope spec to its config, then load the model
    (fp32, eval, CPU) and tokenizer. A config that already carries rope scaling plus a scaling flag needs
    ``--replace`` (rope_scaling.apply_rope enforces it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ropescale.tiny import resolve_model

    path = resolve_model(name)
    config = AutoConfig.from_pretrained(str(path))
    from rope_scaling import apply_rope, extended_context, read_rope, rope_state

    if spec is not None:
        apply_rope(config, spec)  # no-op for none; refuses to stack on existing scaling without --replace
    eff = read_rope(config)
    model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.float().eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    orig = int(rope_state(config).orig_ctx)
    return Loaded(model, tok, Path(path), str(name or "tiny"), eff.to_dict(), float(eff.scale or 1.0), orig,
                  int(extended_context(config)))


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- CLI
def add_common_args(ap: argparse.ArgumentParser, data_help: str, lengths_help: str | None) -> None:
    """The flags every probe takes: model, rope flags, output, data, lengths (when ``lengths_help``), seed, sizes."""
    from rope_scaling import add_rope_args

    ap.add_argument("--model", default="tiny", help="HF model directory, or 'tiny' (the embedded default)")
    ap.add_argument("--out", required=True, help="run directory to write (resumes if it exists with same settings)")
    ap.add_argument("--data", default=str(CHAPTERS_JSONL), help=data_help + f" (default: {CHAPTERS_JSONL})")
    if lengths_help:
        ap.add_argument("--lengths", type=_int_list, default=None, help=lengths_help)
    ap.add_argument("--n", type=int, default=8, help="number of items (examples) per column (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="random seed: the run is deterministic given it")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per forward pass (default 4)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_rope_args(ap)


# flags that must be positive when given (a probe has the ones it registers); 0 means "the default" for others
POSITIVE_FLAGS = ("n", "batch_size", "target_len", "suffix_len", "seeds")
NON_NEGATIVE_FLAGS = ("threads", "length", "tail_chapters", "max_sentences", "window")


def check_positive(**sizes: int | None) -> None:
    """Each given size (None = not given) must be a positive integer: ``--name must be positive, got V``."""
    for name, v in sizes.items():
        if v is not None and v <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {v}")


def check_args(args: argparse.Namespace) -> None:
    """Validate the sizes and the output of a probe's parsed flags (before any data or model is loaded)."""
    check_positive(**{k: getattr(args, k) for k in POSITIVE_FLAGS if hasattr(args, k)})
    for k in NON_NEGATIVE_FLAGS:
        v = getattr(args, k, None)
        if v is not None and v < 0:
            raise InputError(f"--{k.replace('_', '-')} must not be negative, got {v}")
    lengths = getattr(args, "lengths", None)
    if lengths is not None and any(v <= 0 for v in lengths):
        raise InputError(f"--lengths must be positive, got {lengths}")
    check_output_dir(args.out)


def prepare(args: argparse.Namespace, load_data):
    """What every probe's ``main`` starts with: check the flags and ``--out``, set the thread count, read its data
    (``load_data()``, first, so a bad file fails before a model loads) and load the model with the RoPE flags.
    Returns (data, Loaded)."""
    from rope_scaling import spec_from_args

    check_args(args)
    set_threads(args.threads)
    data = load_data()
    return data, load_model(args.model, spec_from_args(args))


def _int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {s!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {s!r}")
    return vals


int_list = _int_list


def default_lengths(orig_ctx: int) -> list[int]:
    """1x .. 8x the original context: orig, 2*orig, ..., 8*orig."""
    return [orig_ctx * i for i in range(1, 9)]


def rng_for(seed: int, *parts: Any) -> random.Random:
    """A deterministic RNG for one item (independent of iteration order)."""
    return random.Random("|".join(map(str, (seed,) + parts)))


# ---------------------------------------------------------------- run dir
SETTINGS = ("probe", "model", "rope", "scale", "lengths", "seed", "settings")


class ProbeRun:
    """A probe's run directory: meta, resumable item log, summary. Creating one only checks ``out`` (a directory
    or nothing; an existing run must have the same settings); the directory and run.json are written with the
    first result (:meth:`add`) or at :meth:`finish`, so a run that fails before its first result leaves nothing."""

    def __init__(self, out: str | os.PathLike, probe: str, loaded: Loaded, lengths: list[int], seed: int,
                 settings: dict, args: argparse.Namespace | None = None, metric: str = "", column: str = ""):
        self.dir = RunDir(check_output_dir(out))
        meta = {"kind": "probe", "probe": probe, "model": loaded.name, "model_path": str(loaded.path),
                "rope": loaded.rope, "scale": loaded.scale, "orig_ctx": loaded.orig_ctx,
                "context": loaded.context, "train_length": None, "lengths": lengths, "seed": seed,
                "settings": settings, "metric": metric, "column": column,
                "args": {k: v for k, v in vars(args).items() if k != "func"} if args else {}}
        if self.dir.exists():
            old = self.dir.read_meta()
            diff = [k for k in SETTINGS if _norm(old.get(k)) != _norm(meta.get(k))]
            if diff:
                raise InputError(f"run directory holds a run with different {', '.join(diff)}; "
                                 f"use a new --out", self.dir.meta_path)
            meta["created"] = old.get("created", now())
        self.meta = meta
        self.log = self.dir.log(ITEMS)
        self._started = False

    def start(self) -> None:
        """Create the directory and write run.json (once): called with the first result."""
        if not self._started:
            self.dir.path.mkdir(parents=True, exist_ok=True)
            self.dir.write_meta(self.meta)
            self._started = True

    def done(self, rid: str) -> bool:
        return rid in self.log

    def add(self, record: dict) -> None:
        self.start()
        self.log.append(record)

    def finish(self, extra: dict | None = None) -> dict:
        self.start()
        summary = summarize(self.log.records())
        summary.update({"probe": self.meta["probe"], "metric": self.meta["metric"],
                        "column": self.meta["column"], "model": self.meta["model"], "rope": self.meta["rope"],
                        "scale": self.meta["scale"]})
        if extra:
            summary.update(extra)
        self.dir.write_json(SUMMARY, summary)
        self.dir.update_meta(finished=now(), items=len(self.log))
        return summary


def _norm(v):
    import json

    return json.loads(json.dumps(v, sort_keys=True, default=str))


def summarize(records: Iterable[dict]) -> dict:
    """Mean ``value`` and count per (group, col), in first-seen group order and ascending column order."""
    acc: dict[tuple, list[float]] = {}
    groups: list = []
    for r in records:
        key = (r.get("group", ""), r["col"])
        if key[0] not in groups:
            groups.append(key[0])
        acc.setdefault(key, []).append(float(r["value"]))
    cells = []
    for g in groups:
        cols = sorted({c for (gg, c) in acc if gg == g}, key=_col_key)
        for c in cols:
            vals = acc[(g, c)]
            cells.append({"group": g, "col": c, "value": sum(vals) / len(vals), "n": len(vals)})
    return {"cells": cells}


def _col_key(c):
    return (0, c) if isinstance(c, (int, float)) else (1, str(c))


def set_threads(n: int) -> None:
    if n and n > 0:
        import torch

        torch.set_num_threads(n)


def progress(iterable, desc: str, total: int | None = None):
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, unit="item", leave=False)


def print_summary(summary: dict, as_json: bool = False) -> None:
    """Print a run's cells to stdout (markdown table, or JSON)."""
    import json

    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    from .report import table_rows, to_markdown

    print(to_markdown(*table_rows([summary])))


RunFn = Callable[[argparse.Namespace], int]
