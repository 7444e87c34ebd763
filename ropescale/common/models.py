"""Where a model is: what every ``--model`` resolves to, checked before anything loads.

- ``tiny`` (the default of every command) is the embedded tiny default, committed in ``assets/tiny/``: its
  ``tiny.json`` records the sha256 of its weights, checked once per process (:func:`tiny_asset`). It is never
  built here: ``python -m ropescale make-tiny --build`` builds one (``ropescale.tiny``);
- an existing path is a Hugging Face model directory, checked for a config and whole weights
  (:func:`check_model_dir`, :func:`check_weights`: headers only, never the tensors);
- a name shaped like a hub id (``Qwen/Qwen1.5-7B``) that is not a local path goes to transformers as it is.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from .io import InputError, read_json, sha256_file
from .paths import REPO_ROOT

TINY_NAMES = ("tiny", "")  # what --model takes for the embedded tiny default
ASSET_DIR = REPO_ROOT / "assets" / "tiny"  # the committed build of ropescale.tiny.DEFAULT_SPEC
ASSET_JSON = "tiny.json"  # its record: the spec and its key, the sha256 of the weights, the build's metrics
MODEL_FILE = "model.safetensors"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
REBUILD = "python -m ropescale make-tiny --build --update-asset"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_verified: set[tuple] = set()  # (path, size, mtime) of weights whose sha256 matched their record


def is_tiny(name: str | os.PathLike | None) -> bool:
    """Whether ``--model name`` means the embedded tiny default."""
    return name is None or str(name) in TINY_NAMES


def asset_info(d: str | os.PathLike | None = None) -> dict | None:
    """A tiny build's ``tiny.json`` (default: the committed asset's), or None when there is none."""
    p = Path(ASSET_DIR if d is None else d) / ASSET_JSON
    return read_json(p, ASSET_JSON) if p.is_file() else None


def verify_build(d: str | os.PathLike) -> Path:
    """``d`` when it is a whole tiny build: its ``tiny.json`` is there and its weights have the sha256 it records
    (checked once per process while the file is unchanged); an InputError saying how to restore it otherwise."""
    d = Path(d)
    info = asset_info(d)
    if info is None:
        raise InputError(f"the embedded tiny default is missing ({ASSET_JSON}): restore it (git checkout "
                         f"assets/tiny) or rebuild it: {REBUILD}", d)
    f = d / MODEL_FILE
    st = f.stat() if f.is_file() else None
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns) if st else None
    if key not in _verified:
        want = info["sha256"][MODEL_FILE]
        got = sha256_file(f) if st else "missing"
        if got != want:
            raise InputError(f"{MODEL_FILE} does not match the sha256 in {ASSET_JSON} ({got[:12]} vs {want[:12]}); "
                             f"restore it (git checkout assets/tiny) or rebuild: {REBUILD}", d)
        _verified.add(key)
    return d


def tiny_asset() -> Path:
    """The committed tiny default (``assets/tiny``), its weights checked against their recorded sha256."""
    return verify_build(ASSET_DIR)


def check_model_dir(path: str | os.PathLike) -> Path:
    """``path`` if it is an HF model directory with a config and weights; otherwise an InputError that says what
    the directory is instead (a finetune run to merge first, a folder without weights, not a folder)."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such model directory", p)
    if not p.is_dir():
        raise InputError("not a model directory (a file; pass the folder holding config.json)", p)
    run_json = p / "run.json"
    if run_json.is_file() or (p / "export.json").is_file() or (p / "final" / "export.json").is_file():
        kind = ""
        with contextlib.suppress(Exception):
            kind = json.loads(run_json.read_text(encoding="utf-8")).get("kind", "")
        if kind in ("", "finetune"):
            raise InputError("a finetune run directory, not a model: merge it first "
                             f"(python finetune.py merge --run {p} --out MODEL_DIR) and pass MODEL_DIR", p)
        raise InputError(f"a {kind} run directory, not a model directory", p)
    if not (p / "config.json").is_file():
        raise InputError("not a model directory (no config.json)", p)
    check_weights(p)
    return p


def check_weights(p: Path) -> None:
    """The weights of model directory ``p`` are there and whole: some weight file exists, every shard an index
    names exists, and every safetensors file has a readable header and at least the bytes that header promises
    (a copy cut short is one line here, not a traceback from the loader). Reads headers only, never the tensors."""
    if not any((p / w).is_file() for w in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        raise InputError(f"model directory without weights (none of {', '.join(WEIGHT_FILES)})", p)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        wmap = read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wmap, dict):
            raise InputError("safetensors index without a weight_map", index)
        missing = sorted({s for s in wmap.values() if not (p / str(s)).is_file()})
        if missing:
            raise InputError(f"missing weight shard(s) the index names: {', '.join(missing)}", index)
    for f in sorted(p.glob("*.safetensors")):
        _check_safetensors(f)


def _check_safetensors(f: Path) -> None:
    """safetensors layout: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
    data_offsets: [begin, end]}, optional __metadata__}), then the data; offsets are relative to the data start."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise InputError(f"not a whole safetensors file ({size} bytes; its header cannot be read): a truncated "
                             "or interrupted copy?", f)
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("not a safetensors file (its header is not JSON)", f) from None
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise InputError(f"truncated safetensors file: {size} of the {need} bytes its header describes (an "
                         "interrupted download or copy?)", f)


def resolve_model(name_or_path: str | os.PathLike | None) -> Path:
    """``tiny``/None -> the committed tiny default (:func:`tiny_asset`; never built here); an existing path -> that
    HF model directory (checked: config + weights); a name shaped like a hub id (``Qwen/Qwen1.5-7B``) that is not a
    local path -> passed to transformers as it is (HF's own cache and offline variables apply)."""
    if is_tiny(name_or_path):
        return tiny_asset()
    p = Path(name_or_path)
    if not p.exists() and _HUB_ID.match(str(name_or_path)):
        return p
    return check_model_dir(p)
