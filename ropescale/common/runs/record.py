"""The run record and the run directory: ``run.json`` (:class:`RunRecord`, read one way by :class:`RunMeta`),
the append-only record logs (:class:`RecordLog`), the directory (:class:`RunDir`), a probe run's cells
(:func:`summarize`), the training record a model directory carries (:func:`read_train_record`).

A run directory holds:
- ``run.json``: the run's record (:class:`RunRecord`), written atomically, with the same field names in every stage:
  ``kind`` ("finetune", "generate", "probe"), ``model`` (the model directory used: ``tiny`` for the embedded default,
  else its absolute path), ``model_id`` (``identity.model_id``: what the model *is*, so a model replaced at the same
  path is noticed), ``rope`` (the full RoPE spec the model ran with, read back with
  ``rope_scaling.RopeSpec.from_record``), ``context`` (the context the setting serves,
  ``rope_scaling.hf.served_context``: the RoPE-extended context, an attention method's reach included; null when
  unbounded, DCA), ``train`` (the training record of the model: :func:`read_train_record`; for a finetune run the
  record of the training it does), ``data`` (the data read), ``settings`` (the stage's settings as resolved, flat as
  in a recipe: ``ropescale.common.settings.to_record``, without model, data and rope, which are above), ``info`` (what
  the stage adds: counts, data stats, the probe's name and variants...), ``status``, ``seconds`` (wall time of the
  whole run, summed over its parts when resumed), ``created``, ``updated``, ``versions``. :class:`RunMeta` is the one
  reader, older layouts included (flat settings at the top level, ``args``, ``model_dir`` / ``model_path``,
  ``extended_context``, an integer ``train_length``).
- one or more append-only JSONL record files (``predictions.jsonl`` for generation, ``items.jsonl`` for probes):
  one JSON object a line, each with a unique ``id``. A record is appended with one ``write`` + ``fsync``, so a
  kill -9 loses at most the record in flight; a torn last line is cut off when the log is reopened. Resuming
  skips ids already present and never duplicates one.
- ``summary.json`` / ``scores.json``: derived numbers, written atomically.

Whose directory it is, ``--resume`` and the one resume check are ``resume``'s; one writer at a time is ``locks``'s.
A model directory made by ``finetune.py merge`` carries its training record in ``ropescale_train.json``
(``identity.TRAIN_JSON``): the run's id, the checkpoint step, the RoPE spec, the data and its length (mean, min,
max: the paper's "Train Len." is the mean), the steps, the base model and its id. Every run that reads the model
records it as ``train``."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ropescale import __version__  # the project's version

from ..io import InputError, read_json, write_json_atomic
from ..settings import nested_fields, to_record
from .identity import TRAIN_JSON, TrainLength
from .locks import run_dir_holder

RUN_JSON = "run.json"
ITEMS = "items.jsonl"  # a probe run's record log: one scored item a line (id, group, col, value)
SUMMARY = "summary.json"  # a probe run's cells (summarize)


def versions() -> dict[str, str]:
    """Versions of the packages that shape results (for run.json)."""
    import importlib.metadata as md  # (it loads email and zipfile: only when a run is recorded, never for --help)

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "deepspeed", "vllm", "jieba", "ropescale"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
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


# ---------------------------------------------------------------- the training record a model directory carries
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
    rec = to_record(settings, without=tuple(n for n in ("rope",) if n in nested_fields(type(settings))))
    for k in ("model", "data"):
        rec.pop(k, None)
    return rec
