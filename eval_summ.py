#!/usr/bin/env python
"""eval_summ.py — generate, score and report CNNSum-style summarization runs. See `python eval_summ.py -h`."""
import sys

from evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
