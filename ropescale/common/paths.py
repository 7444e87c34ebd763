"""Where things are: the repository, the shared data beside it, the cache."""
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # ropescale/common/paths.py
# ../shared beside the checkout (CI and developers); override with ROPESCALE_SHARED.
SHARED_DIR = Path(os.environ.get("ROPESCALE_SHARED", REPO_ROOT.parent / "shared"))
DATA_DIR = SHARED_DIR / "data"
CHAPTERS_JSONL = DATA_DIR / "novels" / "chapters.jsonl"
QWEN2_TOKENIZER = DATA_DIR / "tokenizers" / "qwen2"
CACHE_DIR = Path(os.environ.get("ROPESCALE_CACHE", REPO_ROOT / ".cache"))
RECIPES_DIR = REPO_ROOT / "recipes"
DS_CONFIGS_DIR = REPO_ROOT / "ds_configs"
