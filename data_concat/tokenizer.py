"""Loading the tokenizer every data_concat command measures lengths with (``DIR`` or ``tiny``)."""
from __future__ import annotations

import os
from pathlib import Path

from ropescale.common.io import InputError


def resolve_tokenizer_dir(name_or_dir: str | os.PathLike) -> Path:
    """``tiny`` -> the committed tiny default's model dir (its tokenizer lives beside the model); else a
    directory."""
    from ropescale.common.models import is_tiny, resolve_model

    if is_tiny(name_or_dir):
        return Path(resolve_model("tiny"))
    p = Path(name_or_dir)
    if p.exists() and not p.is_dir():
        raise InputError("is a file, expected a tokenizer directory", p)
    if not p.is_dir():
        raise InputError("tokenizer directory not found", p)
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise InputError("not a tokenizer directory (no tokenizer.json / tokenizer_config.json)", p)
    return p


def load_tokenizer(name_or_dir: str | os.PathLike):
    """An HF tokenizer from a directory (or ``tiny``), offline. Must define an EOS token."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    d = resolve_tokenizer_dir(name_or_dir)
    hf_logging.set_verbosity_error()  # long chapters exceed model_max_length; we only count tokens
    tok = AutoTokenizer.from_pretrained(str(d))
    if tok.eos_token_id is None:
        raise InputError("tokenizer has no EOS token (needed to end each summary)", d)
    return tok


def encode_batch(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (no BOS/EOS added)."""
    if not texts:
        return []
    return [list(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]
