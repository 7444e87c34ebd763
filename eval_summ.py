#!/usr/bin/env python
"""eval_summ.py — generate, score and report CNNSum-style summarization runs. See `python eval_summ.py -h`."""
import sys

from ropescale.common.process import prepare_process

prepare_process()  # before torch is imported: the CUDA allocator setting, quiet libraries

from ropescale.evaluation.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
