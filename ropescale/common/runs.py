"""The run record and the run directory: one format for finetune, generate, probes and reports.

A run directory holds:
- ``run.json``: the run's record (:class:`RunRecord`), written atomically, with the same field names in every
  stage: ``kind`` ("finetune", "generate", "probe"), ``model`` (the model directory used: ``tiny`` for the
  embedded default, else its absolute path), ``model_id`` (:func:`model_id`: what the model *is*, so a model
  replaced at the same path is noticed), ``rope`` (the full RoPE spec the model ran with, read back with
  ``rope_scaling.RopeSpec.from_record``), ``context`` (the RoPE-extended context), ``train`` (the training record
  of the model: :func:`read_train_record`; for a finetune run the record of the training it does), ``data`` (the
  data read), ``settings`` (the stage's settings as resolved, flat as in a recipe:
  ``ropescale.common.settings.to_record``, without model, data and rope, which are above), ``info`` (what the
  stage adds: counts, data stats, the probe's name...), ``status``, ``seconds`` (wall time of the whole run,
  summed over its parts when resumed), ``created``, ``updated``, ``versions``. :class:`RunMeta` is the one
  reader, older layouts included (flat settings at the top level, ``args``, ``model_dir`` / ``model_path``,
  ``extended_context``, an integer ``train_length``).
- one or more append-only JSONL record files (``predictions.jsonl`` for generation, ``items.jsonl`` for probes):
  one JSON object a line, each with a unique ``id``. A record is appended with one ``write`` + ``fsync``, so a
  kill -9 loses at most the record in flight; a torn last line is cut off when the log is reopened. Resuming
  skips ids already present and never duplicates one.
- ``summary.json`` / ``scores.json``: derived numbers, written atomically.

A directory holding a run record belongs to that run (:func:`claim_run_dir`): a run of another kind is never written
into it, and a run of the same kind continues it only with the same settings (:func:`check_resume`, the one resume check
every stage calls) and the same model (:func:`model_id`). ``--resume`` says the same in every stage that writes a run
directory (:data:`RESUME_HELP`, :func:`check_resume_mode`): ``auto`` continues the run --out holds or starts one where
there is none, ``never`` starts only a new run; without the flag generate, run and the probes continue (auto), a
fine-tune and a factor search refuse (never: they say how to continue). One process writes it at a time: the writer
holds an advisory lock on ``.lock`` in it (:func:`lock_run_dir`, taken by :func:`open_run_dir`; the kernel drops it when
the process dies, however it dies), and a second writer is refused naming the holder's pid.

A model directory made by ``finetune.py merge`` carries its training record in ``ropescale_train.json``
(:data:`TRAIN_JSON`): the run's id, the checkpoint step, the RoPE spec, the data and its length (mean, min, max:
the paper's "Train Len." is the mean), the steps, the base model and its id. Every run that reads the model
records it as ``train``.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from .io import InputError, check_output_dir, read_json, write_json_atomic

RUN_JSON = "run.json"
ITEMS = "items.jsonl"  # a probe run's record log: one scored item a line (id, group, col, value)
SUMMARY = "summary.json"  # a probe run's cells (summarize)
TRAIN_JSON = "ropescale_train.json"  # a merged model's training record


def versions() -> dict[str, str]:
    """Versions of the packages that shape results (for run.json)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "deepspeed", "vllm", "jieba", "ropescale"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    from ropescale import __version__  # the project's version

    out["ropescale"] = __version__
    return out


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- the record
@dataclass
class RunRecord:
    """What run.json holds, the same fields in every stage (see module doc)."""

    kind: str
    model: str | None = None
    model_id: str | None = None
    rope: dict | None = None
    context: int | None = None
    train: dict | None = None
    data: str | None = None
    settings: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    status: str = "running"
    seconds: float = 0.0
    created: str | None = None
    updated: str | None = None
    versions: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord))


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


def read_train_record(model_dir: str | os.PathLike | None) -> dict | None:
    """The training record a model directory carries: its ``ropescale_train.json`` (written by ``finetune.py
    merge``); for a model merged by an older version into its run directory, the record of that finetune run
    (``run.json`` in the model dir or its parent); else None (a model this project did not fine-tune)."""
    if model_dir is None:
        return None
    d = Path(model_dir)
    f = d / TRAIN_JSON
    if f.is_file():
        return read_json(f, "training record")
    for cand in (d, d.parent):
        meta = RunMeta.find(cand)
        if meta is not None and meta.kind == "finetune":
            return meta.train
    return None


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
    from .models import is_tiny

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


# ---------------------------------------------------------------- record logs and run directories
class RecordLog:
    """An append-only JSONL file of records keyed by ``id`` (see module doc)."""

    def __init__(self, path: str | os.PathLike, key: str = "id"):
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError("is a directory, expected a JSONL record file", self.path)
        self.key = key
        self._repair()
        self._ids = {r[key] for r in self.records() if key in r}

    def _repair(self) -> None:
        """Cut a torn last line (a writer killed mid-record) so appends start on a clean line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise InputError(f"malformed record: {e.msg}", self.path, lineno) from None
        return out

    def done_ids(self) -> set:
        return set(self._ids)

    def __contains__(self, rid) -> bool:
        return rid in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def append(self, record: dict) -> None:
        rid = record.get(self.key)
        if rid is None:
            raise ValueError(f"record has no {self.key!r}")
        if rid in self._ids:
            raise ValueError(f"duplicate record id {rid!r} in {self.path}")
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # umask applies, as for open()
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._ids.add(rid)


class RunDir:
    """A run directory: ``run.json`` + record logs + derived json files."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def meta_path(self) -> Path:
        return self.path / RUN_JSON

    def exists(self) -> bool:
        return self.meta_path.is_file()

    def read_meta(self) -> dict:
        if not self.meta_path.is_file():
            raise InputError("not a run directory (no run.json)", self.path)
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"unreadable run.json: {e}", self.meta_path) from None
        if not isinstance(meta, dict):
            raise InputError("unreadable run.json (not a JSON object)", self.meta_path)
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        meta = dict(meta)
        meta.setdefault("created", now())
        meta["updated"] = now()
        if not meta.get("versions"):
            meta["versions"] = versions()
        write_json_atomic(self.meta_path, meta)

    def write_record(self, rec: RunRecord) -> RunRecord:
        """Write ``rec`` as run.json (created / updated / versions filled in); returns it as written."""
        rec.created = rec.created or now()
        rec.updated = now()
        rec.versions = rec.versions or versions()
        write_json_atomic(self.meta_path, rec.to_json())
        return rec

    def log(self, name: str = "predictions.jsonl", key: str = "id") -> RecordLog:
        return RecordLog(self.path / name, key=key)

    def write_json(self, name: str, obj: Any) -> Path:
        p = self.path / name
        write_json_atomic(p, obj)
        return p

    def read_json(self, name: str) -> Any:
        p = self.path / name
        if not p.is_file():
            raise InputError(f"missing {name}", self.path)
        return json.loads(p.read_text(encoding="utf-8"))


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _recorded(key: str) -> property:
    """A RunMeta property: run.json's ``key`` as recorded (None when absent)."""
    return property(lambda self: self.raw.get(key))


@dataclass
class RunMeta:
    """A run directory's run.json, read one way by every stage (resume checks, the training record of a model,
    score, reports, probes), whatever age of the format wrote it."""

    path: Path  # the run directory
    raw: dict  # run.json as written
    holder: tuple | None = None  # (held, pid) of its lock when read (run_dir_holder): what "running" means now

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "RunMeta":
        """InputError when ``run_dir`` has no readable run.json."""
        raw = RunDir(run_dir).read_meta()
        return cls(Path(run_dir), raw, run_dir_holder(run_dir) if raw.get("status") == "running" else None)

    @classmethod
    def find(cls, run_dir: str | os.PathLike) -> "RunMeta | None":
        """The run in ``run_dir``, or None when there is none (or it cannot be read)."""
        try:
            return cls.read(run_dir) if (Path(run_dir) / RUN_JSON).is_file() else None
        except InputError:
            return None

    @property
    def meta_path(self) -> Path:
        return self.path / RUN_JSON

    @property
    def new_layout(self) -> bool:
        return isinstance(self.raw.get("info"), dict)

    @property
    def kind(self) -> str | None:
        """The recorded kind; for an older run.json without one, what its files say it is."""
        k = self.raw.get("kind")
        if k:
            return str(k)
        if (self.path / "predictions.jsonl").exists() or "prompt" in self.raw:
            return "generate"
        if (self.path / ITEMS).exists() or "probe" in self.raw:
            return "probe"
        if (self.path / "train_log.jsonl").exists() or "data_stats" in self.raw or any(
                self.path.glob("checkpoint-*")):
            return "finetune"
        return None

    @property
    def model(self) -> str | None:
        m = self.raw.get("model")
        if m is None and isinstance(self.raw.get("args"), dict):
            m = self.raw["args"].get("model")
        return None if m is None else str(m)

    model_id = _recorded("model_id")

    @property
    def rope(self) -> Any:
        """The recorded rope (``rope_scaling.RopeSpec.from_record`` reads every form of it)."""
        return self.raw.get("rope")

    @property
    def context(self) -> int | None:
        for k in ("context", "extended_context"):
            v = _number(self.raw.get(k))
            if v is not None:
                return int(v)
        return None

    @property
    def data(self) -> str | None:
        d = self.raw.get("data")
        if d is None:
            d = self.settings.get("data")
        return None if d is None else str(d)

    @property
    def train(self) -> dict | None:
        """The model's training record (see module doc); for an older run.json, what it recorded of it."""
        t = self.raw.get("train")
        if isinstance(t, dict):
            return t
        if self.new_layout:
            return None
        if self.kind == "finetune":  # an older finetune run: its own training
            st = self.raw.get("data_stats") or {}
            length = TrainLength.of(st) or TrainLength.of(self.raw.get("train_length"))
            return {"id": None, "run": str(self.path.resolve()), "rope": self.rope, "data": self.data,
                    "length": length.to_dict() if length else None, "steps": self.raw.get("steps"),
                    "base_model": self.model}
        length = TrainLength.of(self.raw.get("train_length"))
        return {"id": None, "length": length.to_dict()} if length else None

    @property
    def train_length(self) -> TrainLength | None:
        t = self.train
        return TrainLength.of(t.get("length")) if isinstance(t, dict) else None

    @property
    def status(self) -> str | None:
        """The recorded status; a "running" run whose writer was gone when run.json was read (killed: nothing held
        its directory's lock, :func:`run_dir_holder`) reads ``stopped (pid N not running)``."""
        st = self.raw.get("status")
        if st == "running":
            held, pid = self.holder or run_dir_holder(self.path)
            if not held:
                return f"stopped (pid {pid} not running)" if pid else "stopped (not running)"
        return st

    @property
    def seconds(self) -> float:
        """The run's wall time so far (all its parts)."""
        return _number(self.raw.get("seconds")) or 0.0

    @property
    def info(self) -> dict:
        """What the stage added (counts, data stats, the probe...); for an older layout, its top-level extras."""
        if self.new_layout:
            return dict(self.raw["info"])
        return {k: v for k, v in self.raw.items() if k not in RECORD_FIELDS}

    @property
    def settings(self) -> dict:
        """The stage's settings as recorded (flat keys; ``ropescale.common.settings.from_record`` reads them), with
        the model and data the run read. Older layouts: the top level, over what they kept under ``args``
        (finetune, probes) and ``settings`` (probes). The rope is not among them: it is the rope the run used
        (:attr:`rope`)."""
        raw = self.raw
        if self.new_layout:
            merged = dict(raw.get("settings") or {})
            for k in ("model", "data"):
                if raw.get(k) is not None:
                    merged.setdefault(k, raw[k])
            merged.pop("rope", None)
            return merged
        old = {k: v for key in ("args", "settings") if isinstance(raw.get(key), dict) for k, v in raw[key].items()}
        merged = {**old, **{k: v for k, v in raw.items() if k not in ("args", "settings")}}
        merged.pop("rope", None)
        return merged

    def get(self, key: str, default: Any = None) -> Any:
        """A recorded value by name: a record field, else the stage's info, else a setting."""
        if key in self.raw and key not in ("settings", "info"):
            return self.raw[key]
        info = self.info
        if key in info:
            return info[key]
        return self.settings.get(key, default)


# ---------------------------------------------------------------- a probe run's cells
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
        cols = sorted({c for (gg, c) in acc if gg == g}, key=column_key)
        for c in cols:
            vals = acc[(g, c)]
            cells.append({"group": g, "col": c, "value": sum(vals) / len(vals), "n": len(vals)})
    return {"cells": cells}


def column_key(c) -> tuple:
    """A probe's column order: numbers ascending, then names."""
    return (0, c) if isinstance(c, (int, float)) else (1, str(c))


def find_run_dirs(paths: Iterable[str | os.PathLike]) -> Iterator[RunDir]:
    """Yield run directories among ``paths``: each path is a run dir or a folder searched recursively."""
    for p in map(Path, paths):
        if (p / RUN_JSON).is_file():
            yield RunDir(p)
        elif p.is_dir():
            for meta in sorted(p.rglob(RUN_JSON)):
                yield RunDir(meta.parent)
        elif p.exists():
            raise InputError("is a file, expected a run directory (or a folder holding run directories)", p)
        else:
            raise InputError("no such run directory", p)


def settings_record(settings) -> dict:
    """A stage's settings as run.json's ``settings``: flat, as in a recipe (``settings.to_record``), without the
    rope, model and data (record fields of their own: the rope is the one the model ran with)."""
    from .settings import _nested_fields, to_record

    rec = to_record(settings, without=tuple(n for n in ("rope",) if n in _nested_fields(type(settings))))
    for k in ("model", "data"):
        rec.pop(k, None)
    return rec


# ---------------------------------------------------------------- whose directory, and the one resume check
def claim_run_dir(path: str | os.PathLike, kind: str, *, what: str = "--out") -> RunMeta | None:
    """The run already in ``path`` (None when there is none): a directory holding a run record is that run's, so
    a record of another kind (or an unreadable one) is an InputError whatever the flags; the caller decides what a
    run of its own kind may do (:func:`check_resume`)."""
    p = Path(path)
    if not (p / RUN_JSON).exists():
        return None
    meta = RunMeta.read(p)
    if meta.kind != kind:
        raise InputError(f"holds a {meta.kind or 'unknown'} run (run.json), not a {kind} run: a {kind} run is never "
                         f"written into another run's directory; use another {what}", meta.meta_path)
    return meta


RESUME_MODES = ("auto", "never")
RESUME_HELP = ("auto: continue the run in --out (same settings and model only) or start one; never: refuse an --out "
               "that holds a run")


def check_resume_mode(old: "RunMeta | None", resume: str | None, *, what: str = "--out", hint: str = "") -> None:
    """``--resume never`` (or a stage's default never, ``resume`` None there): an InputError when ``old`` (the run
    --out holds) exists, saying how to continue it; ``auto`` lets the caller continue it (:func:`check_resume`)."""
    if resume not in RESUME_MODES:
        raise ValueError(f"resume mode {resume!r}")
    if old is not None and resume == "never":
        status = f" ({old.status})" if old.status else ""
        raise InputError(f"already holds a {old.kind} run{status}: --resume auto continues it (the same settings "
                         f"only){hint}, or use another {what}", old.meta_path.parent)


def open_run_dir(path: str | os.PathLike, kind: str, *, what: str = "--out",
                 resume: str | None = None) -> tuple[Path, RunMeta | None]:
    """Where a run of ``kind`` writes, checked before any work: ``path`` is a directory or does not exist yet (no
    parent of it is a file), can be written, holds no run of another kind (:func:`claim_run_dir`) nor, with
    ``resume`` "never", one of this kind (:func:`check_resume_mode`), and no other process is writing it
    (:func:`lock_run_dir`, held until the process ends or :func:`release_run_dirs`). Returns (the path, the run
    already there or None); the caller decides whether that run may continue (:func:`check_resume`)."""
    p = check_output_dir(path, what)
    old = claim_run_dir(p, kind, what=what)
    if resume is not None:
        check_resume_mode(old, resume, what=what)
    lock_run_dir(p, what=what)
    return p, old


# ---------------------------------------------------------------- one writer per run directory
LOCK_FILE = ".lock"  # in the run directory: flock'ed by its writer; holds "pid host" of that writer


@dataclass
class _Held:
    fd: int
    created: list[Path]  # the directories this process made to hold the lock (removed again when left empty)


_held: dict[str, _Held] = {}


def _dist_rank() -> int:
    """This process's rank under a launcher (torchrun / deepspeed set RANK), 0 alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def lock_run_dir(path: str | os.PathLike, *, what: str = "--out") -> None:
    """Hold ``path`` for this process: an exclusive ``fcntl.flock`` on ``path/.lock`` (the directory is made if
    need be), released by the kernel when the process ends. Another process holding it: an InputError naming its
    pid and host. Held already by this process: nothing to do. Under a launcher only rank 0 takes it (the ranks of
    one job are one writer: rank 0 writes the run record; another job's rank 0 is refused)."""
    import fcntl

    p = Path(path)
    key = os.path.abspath(p)
    if key in _held or _dist_rank() != 0:
        return
    created = [d for d in (p, *p.parents) if not d.exists()]
    p.mkdir(parents=True, exist_ok=True)
    lock = p / LOCK_FILE
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            who = f"pid {holder[0]}" + (f" on {holder[1]}" if len(holder) > 1 else "") if holder else "another process"
            raise InputError(f"another process is writing this run directory ({who}): wait for it to end, stop it, "
                             f"or use another {what}", p) from None
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break  # the file still at that name: ours (not one a leaving holder just unlinked)
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = _Held(fd, created)


def run_dir_holder(path: str | os.PathLike) -> tuple[bool, str | None]:
    """(whether a process holds run directory ``path`` now, the pid its lock file names: the holder's, or the last
    one's when it was killed before it could clean up). Asked with a shared lock taken and dropped at once."""
    import fcntl

    lock = Path(path) / LOCK_FILE
    if os.path.abspath(path) in _held:
        return True, str(os.getpid())
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False, None
    try:
        words = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
    finally:
        os.close(fd)  # (drops the shared lock)
    return held, words[0] if words else None


def release_run_dirs(keys: Iterable[str] | None = None) -> None:
    """Give up the run directories this process holds (``keys``: those of :func:`lock_run_dir`, default all): the
    lock file goes, and so do the directories made only to hold it when nothing else was written into them (a run
    refused after its checks leaves nothing behind)."""
    for key in list(_held) if keys is None else [k for k in keys if k in _held]:
        h = _held.pop(key)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(key, LOCK_FILE))  # unlinked before the lock drops: a waiter re-checks the name
        os.close(h.fd)
        for d in h.created:
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty


atexit.register(release_run_dirs)


@contextlib.contextmanager
def run_dir_scope():
    """The run directories taken inside the block (or the decorated call) are given up when it ends, however it
    ends: what a library call such as ``generate(...)`` opened is free again when it returns or raises."""
    before = set(_held)
    try:
        yield
    finally:
        release_run_dirs([k for k in _held if k not in before])


def resume_diffs(old: RunMeta, settings, *, rope=None, model_id: str | None = None,
                 also: Iterable[tuple[str, Any, Any]] = ()) -> list[str]:
    """``key old -> new`` for what differs between the run recorded in ``old`` and the resolved ``settings`` (a
    stage's settings dataclass, compared by each field's resume rule), the ``rope`` the model runs with (a
    ``RopeSpec``), the model's identity, and the ``also`` items (key, old, new); empty when it may continue."""
    from .settings import _nested_fields, diff, fmt, from_record, recorded_keys

    diffs = []
    if rope is not None:
        was_rope = type(rope).from_record(old.rope, old.meta_path)
        if not was_rope.same_rope(rope):
            a, b = was_rope.label(), rope.label()
            if a == b:  # the label hides the field that differs (e.g. orig_ctx): name it
                da, db = was_rope.to_dict(), rope.to_dict()
                b += " (" + ", ".join(f"{k} {fmt(da.get(k))} -> {fmt(db.get(k))}" for k in sorted({*da, *db})
                                      if da.get(k) != db.get(k)) + ")"
            diffs.append(f"rope {a} -> {b}")
    if model_id is not None and old.model_id is not None and model_id != old.model_id:
        diffs.append(f"model_id {old.model_id} -> {model_id} (not the model this run read)")
    cls = type(settings)
    without = tuple(n for n in ("rope",) if n in _nested_fields(cls))
    was = from_record(cls, old.settings, where=old.meta_path, without=without)
    diffs += diff(was, settings, only=recorded_keys(cls, old.settings))
    diffs += [f"{k} {fmt(a)} -> {fmt(b)}" for k, a, b in also if a != b]
    return diffs


def refuse_resume(diffs: list[str], where: str | os.PathLike, *, note: str = "",
                  hint: str = "use another --out") -> InputError:
    """The one message of a refused resume: ``RUN.JSON: holds a run made with different settings: a 1 -> 2, ...``."""
    return InputError(f"holds a run made with different settings: {', '.join(diffs)}{note}; {hint}", where)


def check_resume(old: RunMeta, settings, *, rope=None, model_id: str | None = None,
                 also: Iterable[tuple[str, Any, Any]] = (), note: str = "", hint: str = "use another --out") -> None:
    """Refuse (InputError, one line) to continue ``old`` with other settings, rope or model (:func:`resume_diffs`)."""
    diffs = resume_diffs(old, settings, rope=rope, model_id=model_id, also=also)
    if diffs:
        raise refuse_resume(diffs, old.meta_path, note=note, hint=hint)
