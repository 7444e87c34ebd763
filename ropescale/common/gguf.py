"""A GGUF file as a plain Hugging Face model directory: de-quantised once to fp32 safetensors, config and tokenizer.

transformers reads a GGUF file itself (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package: the
optional ``real-model`` group), but a model loaded that way cannot be saved ("quantized with gguf and is not
serializable") and is de-quantised again at every load (about 19 s for a 135M model on 2 cores). :func:`convert`
does it once: the GGUF-loaded model's tensors are copied into a model built from the same config (without its
``quantization_config``) and that model is saved with the tokenizer, so every command reads the result as any
other model directory. :func:`check_conversion` compares the two on a text window (the loss must agree to
``LOSS_TOL``).

``--model FILE.gguf`` works wherever ``--model`` does (:func:`ropescale.common.models.resolve_model`): the file is
converted on first use into ``.cache/gguf/<name>-<sha256[:16]>/`` (:func:`cached_dir`) and that directory is used.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from .io import InputError, atomic_dir, sha256_file
from .paths import CACHE_DIR

RECORD = "gguf.json"  # what a converted directory was made from: the GGUF file, its sha256, the versions used
LOSS_TOL = 1e-4  # |loss(converted) - loss(GGUF-loaded)| allowed on the check window (fp32 on both sides)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


MAGIC = b"GGUF"
VERSIONS = (2, 3)  # the GGUF versions with 64-bit counts (ggml docs/gguf.md; version 1 had 32-bit ones)
DEFAULT_ALIGNMENT = 32  # of the tensor data, unless general.alignment says otherwise (ggml docs/gguf.md)
# sizes of the metadata value types (ggml docs/gguf.md, enum gguf_metadata_value_type): 8 string, 9 array
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Cut(Exception):
    """The header ends before the bytes it needs (the file was cut short)."""


class _Header:
    """A GGUF file's header read from its start, every read bounded by the file's size."""

    def __init__(self, fh, size: int):
        self.fh, self.size, self.pos = fh, size, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise _Cut
        b = self.fh.read(n)
        self.pos += n
        return b

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def string(self) -> bytes:
        return self.take(self.uint(8))

    def skip_value(self, vtype: int) -> object:
        """Read (a scalar or a string) or skip (an array) one metadata value of type ``vtype``."""
        if vtype in _SCALAR:
            return self.uint(_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        if vtype != 9:
            raise ValueError(f"unknown metadata value type {vtype}")
        itype, n = self.uint(4), self.uint(8)
        if itype in _SCALAR:
            self.take_skip(n * _SCALAR[itype])
        else:
            for _ in range(n):
                self.skip_value(itype)
        return None

    def take_skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Cut
        self.fh.seek(n, 1)
        self.pos += n


def tensor_bytes(ggml_type: int, dims: list[int]) -> int | None:
    """Bytes of a tensor of ``ggml_type`` and shape ``dims``: elements / block size x bytes a block (the gguf
    package's ``GGML_QUANT_SIZES``); None without the package or for a type it does not know."""
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ImportError, ValueError, KeyError):
        return None
    n = math.prod(dims)
    return n // block * nbytes


def check_gguf(path: str | os.PathLike) -> dict:
    """``path`` read as a GGUF file's header (magic, version, metadata, tensor infos; ggml docs/gguf.md) without
    loading a tensor: one line naming the file when it is not GGUF, a version this reader does not know, or cut
    short (its header, or the tensor data the header describes, past the file's end). Returns {version, tensors,
    metadata, bytes, need}: ``need`` the bytes the header describes (None when a tensor type is unknown)."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as fh:
        r = _Header(fh, size)
        try:
            magic = r.take(4)
            if magic != MAGIC:
                raise InputError(f"not a GGUF file (it starts with {magic!r}, a GGUF file with {MAGIC!r})", p)
            version = r.uint(4)
            if version not in VERSIONS:
                raise InputError(f"GGUF version {version}, not one of {', '.join(map(str, VERSIONS))} (not a GGUF "
                                 "file, or one this reader cannot read)", p)
            n_tensors, n_kv = r.uint(8), r.uint(8)
            alignment = DEFAULT_ALIGNMENT
            for _ in range(n_kv):
                key, vtype = r.string(), r.uint(4)
                value = r.skip_value(vtype)
                if key == b"general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            ends = []
            for _ in range(n_tensors):
                r.string()
                dims = [r.uint(8) for _ in range(r.uint(4))]
                ggml_type, offset = r.uint(4), r.uint(8)
                nb = tensor_bytes(ggml_type, dims)
                ends.append(None if nb is None else offset + nb)
        except _Cut:
            raise InputError(f"truncated GGUF file: its header is cut short at byte {size} (an interrupted download "
                             "or copy?)", p) from None
        except ValueError as e:
            raise InputError(f"not a readable GGUF file: {e}", p) from None
    start = -(-r.pos // alignment) * alignment
    need = None if None in ends else start + max(ends, default=0)
    if need is not None and size < need:
        raise InputError(f"truncated GGUF file: {size} of the {need} bytes its header describes (an interrupted "
                         "download or copy?)", p)
    return {"version": version, "tensors": n_tensors, "metadata": n_kv, "bytes": size, "need": need}


def _need_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise InputError("reading a GGUF file needs the 'gguf' package (pyproject's optional group real-model; "
                         "make setup installs it from requirements.lock)") from None


def load_gguf(path: str | os.PathLike):
    """(model, tokenizer) as transformers loads the GGUF file ``path`` (de-quantised to fp32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _need_gguf()
    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return model, tok


def plain_copy(model):
    """A model built from ``model``'s config without its GGUF ``quantization_config``, holding the same tensors:
    what ``save_pretrained`` accepts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = model.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        d.pop(k, None)
    config = AutoConfig.for_model(**d)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"the GGUF model's tensors do not fit its config: missing {missing}, unexpected "
                           f"{unexpected}")
    fresh.tie_weights()
    return fresh.eval()


def window_loss(model, ids) -> float:
    """Mean next-token loss (nats) of ``model`` on the token list ``ids`` (one forward)."""
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        return float(model(input_ids=x, labels=x).loss)


def check_conversion(gguf_model, converted, ids) -> dict:
    """The loss of the GGUF-loaded model and of the converted one on ``ids``: a RuntimeError past ``LOSS_TOL``."""
    a, b = window_loss(gguf_model, ids), window_loss(converted, ids)
    if abs(a - b) > LOSS_TOL:
        raise RuntimeError(f"the converted model's loss {b:.6f} differs from the GGUF's {a:.6f} by more than "
                           f"{LOSS_TOL:g}")
    return {"tokens": len(ids), "loss_gguf": round(a, 6), "loss_converted": round(b, 6)}


def convert(path: str | os.PathLike, out: str | os.PathLike, *, check_text: str | None = None,
            check_tokens: int = 2048, extra: dict | None = None) -> dict:
    """Write the GGUF file ``path`` as a model directory ``out`` (atomically: all of it or nothing): fp32
    safetensors, config.json, generation config, tokenizer, and :data:`RECORD` (the file, its sha256 and size,
    the transformers and gguf versions, ``extra``, and with ``check_text`` the loss check of
    :func:`check_conversion` on its first ``check_tokens`` tokens). Returns the record."""
    from importlib.metadata import version

    p = Path(path)
    if not p.is_file():
        raise InputError("no such GGUF file", p)
    check_gguf(p)
    t0 = time.time()
    log(f"[gguf] reading {p} (de-quantising to fp32)")
    try:
        model, tok = load_gguf(p)
        plain = plain_copy(model)
    except (ValueError, RuntimeError, KeyError, TypeError, NotImplementedError) as e:  # a whole file, not a model
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(f"a GGUF file transformers cannot read as a model ({type(e).__name__}: {why})", p) from None
    record = {"gguf_file": p.name, "sha256": sha256_file(p), "bytes": p.stat().st_size,
              "transformers": version("transformers"), "gguf": version("gguf"), **(extra or {})}
    if check_text is not None:
        ids = tok(check_text, add_special_tokens=False)["input_ids"][:check_tokens]
        record["check"] = check_conversion(model, plain, ids)
        log(f"[gguf] loss on the check window ({len(ids)} tokens): GGUF {record['check']['loss_gguf']}, "
            f"converted {record['check']['loss_converted']}")
    with atomic_dir(out) as tmp:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    log(f"[gguf] wrote {out} in {time.time() - t0:.0f} s")
    return record


def cached_dir(path: str | os.PathLike, **convert_kw) -> Path:
    """The model directory of the GGUF file ``path`` (``--model FILE.gguf``): converted on first use
    (:func:`convert`, ``convert_kw`` passed on) into ``.cache/gguf/<stem>-<sha256[:16]>/``, reused while the file's
    sha256 is the same."""
    p = Path(path)
    check_gguf(p)  # not GGUF, or cut short: one line before the sha256 and the conversion
    digest = sha256_file(p)
    out = CACHE_DIR / "gguf" / f"{p.stem}-{digest[:16]}"
    rec = out / RECORD
    if rec.is_file() and json.loads(rec.read_text(encoding="utf-8")).get("sha256") == digest:
        return out
    log(f"[gguf] {p}: converting it once into {out} (later runs reuse it)")
    convert(p, out, **convert_kw)
    return out
