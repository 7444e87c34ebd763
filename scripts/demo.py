#!/usr/bin/env python
"""The end-to-end demo's command (``make demo`` runs it through scripts/demo.sh; README command (1)); ``--help`` says
its six steps and every flag.

A shim: the demo is the package ropescale/demo/ and its entry point is ``python -m ropescale.demo``
(ropescale/demo/cli.py: the description, the flags). Each flag is a field of one settings dataclass,
``ropescale.demo.DemoSettings`` (help, default, check; also a ``--recipe`` YAML key), which ``run_demo`` takes and
report/demo.json records. This file only calls that entry point, so ``make demo``, the flags and their defaults are
the same either way, and its usage line says ``demo.py``. The project is installed into .venv (editable), so nothing
here touches sys.path.
"""
import sys

from ropescale.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
