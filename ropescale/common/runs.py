"""The run directory format shared by finetune, generation, probes and reports.

A run directory holds:
- ``run.json``: metadata written atomically: the stage's settings as the run resolved them (flat keys, as in a
  recipe: ``ropescale.common.settings.to_record``; ``model`` is the model directory used, ``data`` the data read...),
  ``kind`` ("generate", "probe", "finetune"), ``rope`` (the rope the model ran with: a rope spec dict, read back
  with ``rope_scaling.RopeSpec.from_record``), ``train_length`` (or null), ``versions``, timestamps, and whatever
  the producer adds (``status``, ``counts``, ``probe``...). :class:`RunMeta` is the one reader (older layouts
  included).
- one or more append-only JSONL record files (``predictions.jsonl`` for generation, ``items.jsonl`` for probes):
  one JSON object a line, each with a unique ``id``. A record is appended with one ``write`` + ``fsync``, so a
  kill -9 loses at most the record in flight; a torn last line is cut off when the log is reopened. Resuming
  skips ids already present and never duplicates one.
- ``summary.json`` / ``scores.json``: derived numbers, written atomically.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from .io import InputError, write_json_atomic

RUN_JSON = "run.json"


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
            return json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"unreadable run.json: {e}", self.meta_path) from None

    def write_meta(self, meta: dict[str, Any]) -> None:
        meta = dict(meta)
        meta.setdefault("created", now())
        meta["updated"] = now()
        meta.setdefault("versions", versions())
        write_json_atomic(self.meta_path, meta)

    def update_meta(self, **fields: Any) -> dict:
        meta = self.read_meta() if self.exists() else {}
        meta.update(fields)
        self.write_meta(meta)
        return meta

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


@dataclass
class RunMeta:
    """A run directory's run.json, read one way by every stage (finetune resume, generate resume and the training
    length of a merged model, score, report, probes), whatever age of the format wrote it."""

    path: Path  # the run directory
    raw: dict  # run.json as written

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "RunMeta":
        """InputError when ``run_dir`` has no readable run.json."""
        return cls(Path(run_dir), RunDir(run_dir).read_meta())

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
    def kind(self) -> str | None:
        return self.raw.get("kind")

    @property
    def model(self) -> str | None:
        return self.raw.get("model")

    @property
    def rope(self) -> Any:
        """The recorded rope (``rope_scaling.RopeSpec.from_record`` reads every form of it)."""
        return self.raw.get("rope")

    @property
    def train_length(self) -> int | None:
        tl = self.raw.get("train_length")
        return int(tl) if isinstance(tl, (int, float)) and not isinstance(tl, bool) else None

    @property
    def settings(self) -> dict:
        """The stage's settings as recorded (flat keys; ``ropescale.common.settings.from_record`` reads them): the top level
        of run.json, over what older runs kept under ``args`` (finetune, probes) and ``settings`` (probes). The
        ``rope`` entry is not among them: it is the rope the run used (:attr:`rope`)."""
        raw = self.raw
        old = {k: v for key in ("args", "settings") if isinstance(raw.get(key), dict) for k, v in raw[key].items()}
        merged = {**old, **{k: v for k, v in raw.items() if k not in ("args", "settings")}}
        merged.pop("rope", None)
        return merged

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


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
