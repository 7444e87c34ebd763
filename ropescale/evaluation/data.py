"""Evaluation data for ``eval_summ``: CNNSum-format samples, the subset they belong to, and release files.

``--data`` accepts
- a local JSONL file (one ``{"context", "summary"[, "id"][, "subset"]}`` object a line; read here, errors name
  ``FILE:LINE``);
- a local Parquet file, or a directory: a ``datasets`` ``save_to_disk`` directory (``datasets.load_from_disk``) or a
  folder of JSONL / Parquet files (``datasets.load_dataset(DIR)``);
- anything else is handed to ``datasets.load_dataset`` as a dataset name, e.g. the CNNSum release on the Hugging
  Face hub, ``CxsGHost/CNNSum``, whose four files sit side by side at the top of the repository, so pick one with
  ``--data-files cnnsum_L_16k.jsonl`` (the file name then also tells the subset).

``datasets`` is imported only for the last two cases. Rows read through ``datasets`` are numbered from 1 in error
messages (``NAME:ROW``). A split is chosen with ``--data-split``; a dataset with a single split needs none.

The subset of a file (what sets the default max new tokens and the report's columns): ``--subset`` if given, else
the records' ``subset`` field (``data_concat sample`` writes it: ``L``, ``XL``, ``2XL``, ``3XL`` or ``T<tokens>``; all
records must agree), else the release file name (``cnnsum_XXL_64k.jsonl`` or ``cnnsum_2XL.jsonl`` -> 2XL).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ropescale.common import subsets
from ropescale.common.io import InputError, read_jsonl

CNNSUM_HUB_ID = "CxsGHost/CNNSum"  # the official release on the Hugging Face hub (four JSONL files)
PARQUET = (".parquet", ".pq")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".arrow") + PARQUET
# a release file name: cnnsum_L_16k.jsonl, cnnsum_XXL_64k.jsonl, cnnsum_2XL.jsonl, ... (case-insensitive)


@dataclass(frozen=True)
class Source:
    """Where samples come from: ``kind`` is ``jsonl`` (read here) or ``datasets``; ``label`` names it in messages
    and run.json (a resolved local path, or the dataset name as given)."""

    label: str
    kind: str
    path: Optional[Path] = None  # local file or directory
    data_files: Optional[str] = None
    split: Optional[str] = None

    @property
    def file_name(self) -> str:
        """The name that may carry the subset: the data file's (``--data-files``) or the path's."""
        return Path(self.data_files).name if self.data_files else Path(self.label).name


def _looks_local(s: str) -> bool:
    """A path (that does not exist) rather than a dataset name: starts like a path or ends like a data file."""
    return s.startswith(("/", "./", "../", "~")) or Path(s).suffix.lower() in DATA_SUFFIXES


def open_source(data, data_files: Optional[str] = None, split: Optional[str] = None) -> Source:
    """Classify ``--data`` (see the module doc); a local path that does not exist is an InputError."""
    if data is None or not str(data).strip():
        raise InputError("--data is empty")
    s = str(data)
    p = Path(s).expanduser()
    if p.is_file() and p.suffix.lower() not in PARQUET:
        if data_files or split:
            raise InputError("--data-files / --data-split apply to a directory or a dataset name, not to a file", p)
        return Source(str(p.resolve()), "jsonl", p)
    if p.exists():
        if not (p.is_file() or p.is_dir()):
            raise InputError("not a regular file or a directory", p)
        return Source(str(p.resolve()), "datasets", p, data_files, split)
    if _looks_local(s):
        raise InputError("no such file or directory", p)
    return Source(s, "datasets", None, data_files, split)


def _load_dataset(src: Source):
    """The ``datasets.Dataset`` a datasets source names (split chosen), or InputError in one line."""
    try:
        import datasets
    except ImportError:
        raise InputError("reading this --data needs the datasets package (pip install datasets)", src.label) from None
    from datasets.utils import logging as ds_logging

    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()  # stderr: the run's own log lines, and a failure stays one line
    try:
        if src.path is not None and src.path.is_dir() and not src.data_files and (
                (src.path / "dataset_info.json").is_file() or (src.path / "dataset_dict.json").is_file()
                or (src.path / "state.json").is_file()):
            ds = datasets.load_from_disk(str(src.path))
        elif src.path is not None and src.path.is_file():
            ds = datasets.load_dataset("parquet", data_files=str(src.path))
        else:
            ds = datasets.load_dataset(str(src.path) if src.path is not None else src.label,
                                       data_files=src.data_files)
    except InputError:
        raise
    except Exception as e:  # datasets raises many types (FileNotFound, DatasetNotFound, HTTP, ...)
        msg = (str(e).strip().splitlines() or [""])[0][:300]
        raise InputError(f"datasets could not load it: {type(e).__name__}: {msg}", src.label) from None
    finally:
        if bars:
            ds_logging.enable_progress_bar()
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if src.split is not None:
            if src.split not in ds:
                raise InputError(f"no split {src.split!r} (splits: {', '.join(names)})", src.label)
            return ds[src.split]
        if len(names) != 1:
            raise InputError(f"{len(names)} splits ({', '.join(names)}): pass --data-split", src.label)
        return ds[names[0]]
    if src.split is not None and getattr(ds, "split", None) not in (None, src.split):
        raise InputError(f"--data-split {src.split!r}: this dataset is the {ds.split!r} split", src.label)
    return ds


def iter_rows(src: Source, required=()) -> Iterator[dict]:
    """Raw rows (dicts with ``_line``: the JSONL line, or the row number from 1) of a source."""
    if src.kind == "jsonl":
        yield from read_jsonl(src.path, required=required)
        return
    ds = _load_dataset(src)
    missing = [k for k in required if k not in (ds.column_names or [])]
    if missing:
        raise InputError(f"missing column(s) {', '.join(map(repr, missing))} (columns: "
                         f"{', '.join(ds.column_names or [])})", src.label)
    for i, row in enumerate(ds, 1):
        row = dict(row)
        row.setdefault("_line", i)
        yield row


def load_samples(data, limit: Optional[int] = None, *, data_files: Optional[str] = None,
                 split: Optional[str] = None, source: Optional[Source] = None) -> list[dict]:
    """CNNSum rows as {id, context, reference, subset (the record's field or None), line}; bad rows raise
    InputError naming file:line (row for datasets sources); a source without rows is an InputError."""
    src = source or open_source(data, data_files, split)
    rows, seen = [], {}
    for r in iter_rows(src, required=("context", "summary")):
        line = r["_line"]
        if not isinstance(r["context"], str) or not r["context"].strip():
            raise InputError("'context' must be a non-empty string", src.label, line)
        if not isinstance(r["summary"], str):
            raise InputError("'summary' must be a string", src.label, line)
        rid = r.get("id", line)
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise InputError(f"'id' must be a string or an integer, got {rid!r}", src.label, line)
        if rid in seen:
            raise InputError(f"duplicate id {rid!r} (first on line {seen[rid]})", src.label, line)
        sub = r.get("subset")
        if sub is not None and not isinstance(sub, str):
            raise InputError(f"'subset' must be a string (L, XL, 2XL, 3XL or T<tokens>), got {sub!r}", src.label,
                             line)
        seen[rid] = line
        rows.append({"id": rid, "context": r["context"], "reference": r["summary"], "subset": sub, "line": line})
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise InputError("no samples (the data is empty)", src.label)
    return rows


# ---------------------------------------------------------------- subsets


def records_subset(samples: list[dict], label: str) -> Optional[subsets.Subset]:
    """The subset every record names in its ``subset`` field (None when no record has one); records that disagree
    (or a record without the field among records with it) are an InputError naming the first such line."""
    if all(s.get("subset") is None for s in samples):
        return None
    first = samples[0]
    ref = None if first.get("subset") is None else subsets.parse(first["subset"], (label, first["line"]))
    for s in samples[1:]:
        v = s.get("subset")
        cur = None if v is None else subsets.parse(v, (label, s["line"]))
        if (cur is None) != (ref is None) or (cur is not None and cur.name != ref.name):
            here = "has no 'subset'" if cur is None else f"has subset {cur.name!r}"
            there = "none" if ref is None else repr(ref.name)
            raise InputError(f"{here} but line {first['line']} has {there}: all records of one data file must "
                             f"name the same subset (or pass --subset)", label, s["line"])
    return ref




# ---------------------------------------------------------------- the release files of a directory
def find_release_files(data_dir) -> tuple[dict[str, Path], list[str]]:
    """({subset: file} for the CNNSum release files in ``data_dir``, [subsets with no file]), in L, XL, 2XL, 3XL
    order. Both spellings (2XL / XXL, 3XL / XXXL), with or without the ``_16k``-style suffix, JSONL or Parquet.
    Two files for one subset, or none at all, are an InputError."""
    d = Path(data_dir)
    if not d.is_dir():
        raise InputError("no such directory" if not d.exists() else "not a directory", d)
    found: dict[str, Path] = {}
    for p in sorted(d.iterdir()):
        if not p.is_file() or not subsets.RELEASE_RE.fullmatch(p.name):
            continue
        name = subsets.from_filename(p.name).name
        if name in found:
            raise InputError(f"two files for subset {name}: {found[name].name} and {p.name}", d)
        found[name] = p
    if not found:
        raise InputError("no CNNSum release files here (cnnsum_L_16k.jsonl, cnnsum_XL_32k.jsonl, "
                         "cnnsum_XXL_64k.jsonl, cnnsum_XXXL_128k.jsonl; 2XL/3XL spellings and names without the "
                         "_16k-style suffix are accepted too)", d)
    ordered = {k: found[k] for k in subsets.ORDER if k in found}
    return ordered, [k for k in subsets.ORDER if k not in found]
