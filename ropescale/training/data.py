"""Training data: packed samples (data_concat's format), the default data of the tiny model, batching.

A packed sample is one long token sequence (several prompt + summary pairs concatenated, Sec 5) with labels
-100 everywhere except on the summaries. By default it is trained as one sequence (positions 0..len-1, causal
attention across its pairs), like the paper; ``--positions``, ``--attention`` and ``--pose-target`` choose other
position ids and a per-pair (document) mask from the pack's pair boundaries (:func:`policy_of`; what each means:
``ropescale.training.positions``): the dataset then adds ``position_ids`` and ``segment_ids`` to each sample, drawn from
(run seed, sample index, epoch) so a resume redraws the same PoSE ids, and the collator pads them.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from data_concat.packed import IGNORE_INDEX, TRAIN_FILE
from ropescale.common.io import InputError
from ropescale.common.paths import CACHE_DIR, CHAPTERS_JSONL

from .positions import PAD_SEGMENT, Policy, check_samples, sample_positions


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the default data (tiny model)
def default_data_range(orig_ctx: int, extended: int, factor: float = 2.0) -> tuple[int, int, int]:
    """(target, min, max) of the default packed data: target = factor x the original context, in the paper's
    proportions (14K-18K around 16K: min = 7/8 target, max = 9/8 target). Where that does not fit the extended
    context (no RoPE scaling, or a small scale), the samples fill the context itself instead: half of it to all of
    it (the unscaled tiny default: 256-512 tokens), so a run without --rope trains inside the model's context."""
    from data_concat.pack import parse_target

    target = int(round(factor * orig_ctx))
    if target * 9 // 8 > extended:
        lo, hi = extended // 2, extended
        return (lo + hi) // 2, lo, hi
    _, lo, hi = parse_target(target)  # the 16k preset's proportions, as ``pack --target N``
    return target, lo, hi


def build_default_data(model_dir: str | os.PathLike, orig_ctx: int, extended: int, *, factor: float = 2.0,
                       n_samples: int = 64, seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (once) and cache fine-tuning data from the shared novels, sized for the model: pairs of the recall
    task (:mod:`ropescale.common.recall`: sentences marked 【k】 spread over an excerpt of the training chapters, the
    marked sentences in order as the answer), one pair a sample, packed with the F.2 prompts into samples of
    ``factor`` x the original context (min 7/8, max 9/8 of it, as ``pack --target N``). The tiny default was
    pretrained on the same task inside its context, so a fine-tune on this data shows what a RoPE method does to
    its reach. Returns the packed directory."""
    from data_concat import pack
    from data_concat.tokenizer import load_tokenizer
    from ropescale.common.chapters import read_chapters
    from ropescale.common.io import write_jsonl_atomic
    from ropescale.common.recall import HELDOUT, pair_range, recall_samples, sources, split_part

    target, lo, hi = default_data_range(orig_ctx, extended, factor)
    tok_files = sorted(p for p in Path(model_dir).iterdir() if p.name.startswith("tokenizer") or p.name == "vocab.json")
    h = hashlib.sha256()
    for p in tok_files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(json.dumps(["recall", target, lo, hi, n_samples, seed, HELDOUT, str(CHAPTERS_JSONL)]).encode())
    root = Path(cache_dir or CACHE_DIR) / "data" / f"recall-{target}-{h.hexdigest()[:10]}"
    packed = root / "packed"
    if (packed / TRAIN_FILE).is_file():
        return packed
    root.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(model_dir)
    pair_lo, pair_hi = pair_range(tok, lo, hi)
    log(f"[data] building default data: {n_samples} recall pairs of {pair_lo}-{pair_hi} context tokens from the "
        f"training chapters of {CHAPTERS_JSONL}, packed into {lo}-{hi}-token samples -> {packed}")
    chapters = split_part(read_chapters(CHAPTERS_JSONL), "train", HELDOUT)
    pairs = recall_samples(sources(chapters, tok), tok, n=n_samples, min_tokens=pair_lo, max_tokens=pair_hi,
                           seed=seed)
    pairs_path = root / "pairs.jsonl"
    write_jsonl_atomic(pairs_path, pairs)
    pack(pairs_path, model_dir, packed, min_tokens=lo, max_tokens=hi, prompt="mix", seed=seed, on_bad="skip")
    return packed


# ---------------------------------------------------------------- loading + checks
def policy_of(settings):
    """The positions policy (``positions.Policy``) of training settings, checked: an unknown value or a bad
    combination is an InputError naming the flag."""
    return Policy(settings.positions, settings.attention, settings.pose_target, settings.pose_chunks).check()


def load_rows(data_dir: str | os.PathLike, boundaries: bool = False):
    """A packed dataset (``data_concat.packed.read_packed``: flat arrays + offsets) that can be trained on: some
    sample has labels. ``boundaries``: read the pairs' starts too, where the set has them."""
    from data_concat.packed import read_packed

    rows = read_packed(data_dir, columns=["input_ids", "labels"], optional=["pair_starts"] if boundaries else ())
    f = Path(data_dir) / TRAIN_FILE
    if len(rows) == 0:
        raise InputError("packed dataset has no samples", f)
    if not (rows.labels != IGNORE_INDEX).any():
        raise InputError("no sample has a label (nothing to train on)", f)
    return rows


def check_rows(rows, *, vocab_size: int, extended: int | None, allow_extrapolation: bool, where,
               rope_desc: str) -> dict:
    """Fail before training when the data cannot be trained on as asked (``extended`` None: the setting serves any
    length, DCA's). Returns length stats."""
    lengths = rows.lengths()
    longest = int(lengths.max())
    top = int(rows.input_ids.max())
    if top >= vocab_size or int(rows.input_ids.min()) < 0:
        raise InputError(f"token id {top} is outside the model's vocabulary ({vocab_size}); the data was packed "
                         f"with another tokenizer", where)
    if extended is not None and longest > extended and not allow_extrapolation:
        raise InputError(f"samples up to {longest} tokens are longer than the {extended}-token context of the "
                         f"model with {rope_desc}; use a larger --scale, shorter data, or --allow-extrapolation",
                         where)
    return {"samples": len(rows), "min": int(lengths.min()), "max": longest, "mean": float(lengths.mean()),
            "tokens": int(lengths.sum()), "supervised": int((rows.labels != IGNORE_INDEX).sum())}


def check_positions(rows, policy, *, extended: int | None, allow_extrapolation: bool, where) -> int:
    """Fail before training when the samples cannot be laid out as ``policy`` asks (``check_samples``: boundaries
    present and valid where needed, every PoSE span shorter than the target) or PoSE's target lies beyond the
    context the setting serves (None: any length). Returns the longest position id the run can train (PoSE:
    target - 1)."""
    longest = check_samples(policy, rows.lengths().tolist(), rows.pair_starts() if policy.needs_boundaries else None,
                            where)
    if policy.pose_target is None:
        return longest - 1
    if extended is not None and policy.pose_target > extended and not allow_extrapolation:
        raise InputError(f"--pose-target {policy.pose_target} is beyond the model's {extended}-token extended "
                         f"context; use a larger --scale, a smaller --pose-target, or --allow-extrapolation")
    return policy.pose_target - 1


def one_pair_note(rows, policy, where) -> str | None:
    """What to say when ``--positions reset`` / ``--attention document`` can change nothing: every sample of the data
    holds a single pair, so each pair already starts at position 0 and attends only to itself (the tiny default's
    data, one recall pair a sample). None otherwise."""
    if not policy.needs_boundaries:
        return None
    starts = rows.pair_starts() if hasattr(rows, "pair_starts") else [r.get("pair_starts") for r in rows]
    if starts is None or any(s is None or len(s) > 1 for s in starts):
        return None
    return (f"note: every sample of {where} holds one pair, so --positions {policy.positions} --attention "
            f"{policy.attention} trains exactly what continuous + causal does; pack several pairs a sample (python -m "
            "data_concat pack) for the policy to matter (docs/positions.md)")


class PackedDataset:
    """A map-style dataset of packed samples -> {input_ids, labels} (int64 tensors), from a
    ``data_concat.packed.PackedSet`` or a list of row dicts (``data_concat.load_packed``). With a ``policy`` other
    than the default (continuous + causal, no PoSE), also ``position_ids`` (int64) and ``segment_ids`` (int32) of
    ``positions.sample_positions`` for (``seed``, the sample's index, :attr:`epoch`) (segment ids only
    under document attention)."""

    def __init__(self, rows, policy=None, seed: int = 0):
        self.rows = rows
        self.policy = None if policy is None or policy.is_default else policy
        self.seed = int(seed)
        self.epoch = 0  # set by the trainer at each epoch's start (PoSE draws afresh per epoch)
        self.starts = None
        if self.policy is not None and self.policy.needs_boundaries:
            self.starts = rows.pair_starts() if hasattr(rows, "pair_starts") else [r["pair_starts"] for r in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        import torch

        if hasattr(self.rows, "row"):
            ids, labels = self.rows.row(i)
            out = {"input_ids": torch.from_numpy(ids.astype("int64")),
                   "labels": torch.from_numpy(labels.astype("int64"))}
        else:
            r = self.rows[i]
            out = {"input_ids": torch.tensor(r["input_ids"], dtype=torch.long),
                   "labels": torch.tensor(r["labels"], dtype=torch.long)}
        if self.policy is not None:
            pos, seg = sample_positions(self.policy, len(out["input_ids"]),
                                        self.starts[i] if self.starts is not None else None, seed=self.seed,
                                        index=i, epoch=self.epoch)
            drawn = {"position_ids": pos, "segment_ids": seg}  # causal: no segments (one per row), no T x T mask
            out.update({k: torch.from_numpy(drawn[k]) for k in self.policy.carries()})
        return out


class Collator:
    """Right-pad a batch (pad id, labels -100, attention mask; ``position_ids`` 0 and ``segment_ids``
    ``PAD_SEGMENT`` where the samples carry them); a batch of equal lengths gets no mask."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch: list[dict]) -> dict:
        import torch

        n = max(len(b["input_ids"]) for b in batch)
        extra = [k for k in ("position_ids", "segment_ids") if k in batch[0]]
        if all(len(b["input_ids"]) == n for b in batch):
            return {k: torch.stack([b[k] for b in batch]) for k in ["input_ids", "labels", *extra]}
        fill = {"input_ids": self.pad_id, "labels": IGNORE_INDEX, "attention_mask": 0, "position_ids": 0,
                "segment_ids": PAD_SEGMENT}
        dtypes = {"segment_ids": torch.int32}
        out = {k: torch.full((len(batch), n), fill[k], dtype=dtypes.get(k, torch.long))
               for k in ["input_ids", "labels", "attention_mask", *extra]}
        for i, b in enumerate(batch):
            k = len(b["input_ids"])
            out["attention_mask"][i, :k] = 1
            for key in ["input_ids", "labels", *extra]:
                out[key][i, :k] = b[key]
        return out
