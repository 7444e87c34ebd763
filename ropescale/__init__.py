"""ropescale: the project's front door -- the ``ropescale`` command (``python -m ropescale``) and the embedded tiny
default model (``tiny``). What the stages share lives in ``common/``.
"""
import importlib
import sys

from common import __version__  # noqa: F401

# Old import paths (``ropescale.io`` ...), kept for a release: the modules moved to common/ and these names are
# the very same module objects, not copies.
_MOVED = ("io", "runs", "prompts", "subsets", "chapters", "text")
for _name in _MOVED:
    _mod = importlib.import_module(f"common.{_name}")
    sys.modules[f"{__name__}.{_name}"] = _mod
    globals()[_name] = _mod
from common.paths import (CACHE_DIR, CHAPTERS_JSONL, DATA_DIR, QWEN2_TOKENIZER, REPO_ROOT,  # noqa: E402,F401
                          SHARED_DIR)

del _name, _mod
