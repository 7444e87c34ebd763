"""``python -m ropescale.demo``: the end-to-end demo (:mod:`ropescale.demo.cli`; ``--help`` says its six steps)."""
import sys

from .cli import main

sys.exit(main())
