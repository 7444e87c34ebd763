#!/usr/bin/env python
"""eval_summ.py — generate, score and report CNNSum-style summarization runs. See `python eval_summ.py -h`."""
import os
import sys

# long prompts' KV buffers and per-sample prefills fragment the CUDA caching allocator otherwise
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from ropescale.common.cli import quiet_libraries  # noqa: E402

quiet_libraries()

from ropescale.evaluation.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
