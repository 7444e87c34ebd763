"""What a run read: the model's identity (:func:`model_id`, :func:`model_ref`) and the training behind it (the
training record's length, :class:`TrainLength`; its key; the longest distance it trained, :func:`trained_distance`).
A merged model carries its training record in ``ropescale_train.json`` (:data:`TRAIN_JSON`)."""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io import InputError
from ..models import is_tiny

TRAIN_JSON = "ropescale_train.json"  # a merged model's training record


# ---------------------------------------------------------------- training length and the training record
@dataclass(frozen=True)
class TrainLength:
    """The length of the samples a model was fine-tuned on (tokens): ``mean`` is the paper's "Train Len." (the
    average of the concatenated samples: 14-18K is reported as 16k), ``min`` / ``max`` their range."""

    mean: float | None = None
    min: int | None = None
    max: int | None = None

    @classmethod
    def of(cls, rec: Any) -> "TrainLength | None":
        """From ``{"mean", "min", "max"}`` (a training record's ``length``), data stats, or a bare number (older
        records: the longest sample)."""
        if isinstance(rec, bool) or rec is None:
            return None
        if isinstance(rec, (int, float)):
            return cls(None, None, int(rec))
        if not isinstance(rec, dict):
            return None

        def num(k, conv):
            v = rec.get(k)
            return conv(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        out = cls(num("mean", float), num("min", int), num("max", int))
        return None if out == cls() else out

    def to_dict(self) -> dict:
        return {"mean": None if self.mean is None else round(self.mean, 1), "min": self.min, "max": self.max}

    def text(self) -> str:
        """``1536 (1090-2024)``: the mean with the range; an older record's maximum alone as ``max 2024``."""
        if self.mean is None:
            return "-" if self.max is None else f"max {self.max}"
        rng = f" ({self.min}-{self.max})" if self.min is not None and self.max is not None else ""
        return f"{self.mean:.0f}{rng}"

    def short(self) -> str:
        """The mean as a label shows it: ``1536``, ``16k`` (from 10K tokens on, in units of 1024)."""
        v = self.mean if self.mean is not None else self.max
        if v is None:
            return "?"
        pre = "" if self.mean is not None else "<="
        return pre + (f"{v / 1024:.0f}k" if v >= 10240 else f"{v:.0f}")


def length_of(stats: dict) -> dict:
    """A training record's ``length`` from a packed set's stats (``training.data.check_rows``)."""
    return (TrainLength.of(stats) or TrainLength()).to_dict()


def train_key(train: dict | None) -> str | None:
    """What tells two trainings apart: the run's id and the checkpoint step (``run-id@step``), or None."""
    if not isinstance(train, dict):
        return None
    rid = train.get("id")
    if rid is None:
        return None
    step = train.get("step")
    return f"{rid}@{step}" if step is not None else str(rid)


def trained_distance(record: dict | None, where=None) -> float | None:
    """The longest query-key distance a fine-tune trained, from its training record (what a fine-tune-aware bound
    reads): the position coverage's ``longest_distance`` when it counts the whole run, else ``length.max`` (the
    longest packed sample: of the samples the run consumed, or of the data set when the record does not say; also
    for a coverage counted from a later step, a resume from a checkpoint that kept none); None without either.
    InputError naming ``where`` for a value that is not a number >= 1."""
    if not record:
        return None
    cov, length = record.get("coverage") or {}, record.get("length") or {}
    v = None
    if isinstance(cov, dict) and not cov.get("from_step"):
        v = cov.get("longest_distance")
    if v is None and isinstance(length, dict):
        v = length.get("max")
    if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1):
        raise InputError(f"the longest trained distance is not a number >= 1: {v!r}", where)
    return None if v is None else float(v)


# ---------------------------------------------------------------- the model: as recorded, and its identity
def model_ref(given: str | os.PathLike | None, model_dir: str | os.PathLike) -> str:
    """How a run records the model it read: ``tiny`` for the embedded default, else the absolute path of the
    directory used (a hub id that is not a local path stays as given)."""
    if is_tiny(given):
        return "tiny"
    p = Path(model_dir)
    return str(p.resolve()) if p.exists() else str(given)


WHOLE_FILE = 64 << 20  # weight files up to this size are hashed whole
SAMPLES, SAMPLE_BYTES = 32, 64 << 10  # larger ones: their header and 32 slices of 64 KiB spread over the file


def model_id(model_dir: str | os.PathLike) -> str | None:
    """What a model directory holds, as 16 hex digits (None when it is not a local directory).

    sha256 over: ``config.json``, the training record (``ropescale_train.json``: a merged model names its run and
    step), and each weight file's name and size plus its bytes -- whole up to 64 MiB, else the safetensors header
    (tensor names, dtypes, shapes, offsets) and 32 slices of 64 KiB spread evenly over the file (2 MiB a file, so
    ~10 ms for a 15 GB model). It depends on content only, so a copy of a model has the same id, and it changes
    when a model is replaced at the same path: by another merge (another training record, other weights), another
    checkpoint, or other weights of the same shapes (the slices). File mtimes and the weights' index are not
    used: they change with a copy, or not with the weights."""
    d = Path(model_dir)
    if not d.is_dir():
        return None
    h = hashlib.sha256()
    for name in ("config.json", TRAIN_JSON):
        f = d / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    weights = sorted(p for p in d.iterdir() if p.is_file() and (p.suffix == ".safetensors" or (
        p.suffix == ".bin" and p.name.startswith("pytorch_model"))))
    for f in weights:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= WHOLE_FILE:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
                continue
            start = 0
            if f.suffix == ".safetensors":
                head = fh.read(8)
                n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
                h.update(head + fh.read(min(n, size)))
                start = 8 + n
            span = max(size - start - SAMPLE_BYTES, 0)
            for i in range(SAMPLES):
                fh.seek(start + span * i // max(SAMPLES - 1, 1))
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]
