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
    t0 = time.time()
    log(f"[gguf] reading {p} (de-quantising to fp32)")
    model, tok = load_gguf(p)
    plain = plain_copy(model)
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
    digest = sha256_file(p)
    out = CACHE_DIR / "gguf" / f"{p.stem}-{digest[:16]}"
    rec = out / RECORD
    if rec.is_file() and json.loads(rec.read_text(encoding="utf-8")).get("sha256") == digest:
        return out
    log(f"[gguf] {p}: converting it once into {out} (later runs reuse it)")
    convert(p, out, **convert_kw)
    return out
