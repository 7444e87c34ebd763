"""``python -m ropescale TOOL ...``: the ``ropescale`` command (see ropescale.cli)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
