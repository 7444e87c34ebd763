"""ropescale: shared internals (prompts, subset presets, run directories, I/O, the embedded tiny default).

The top-level packages build on these: rope_scaling/ (RoPE methods), data_concat/ (packing + CNNSum sampling),
training/ (finetune internals), evaluation/ (generation, ROUGE-L, reports), probes/ (long-context probes).
"""
import os
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
# ../shared beside the checkout (CI and developers); override with ROPESCALE_SHARED.
SHARED_DIR = Path(os.environ.get("ROPESCALE_SHARED", REPO_ROOT.parent / "shared"))
DATA_DIR = SHARED_DIR / "data"
CHAPTERS_JSONL = DATA_DIR / "novels" / "chapters.jsonl"
QWEN2_TOKENIZER = DATA_DIR / "tokenizers" / "qwen2"
CACHE_DIR = Path(os.environ.get("ROPESCALE_CACHE", REPO_ROOT / ".cache"))
