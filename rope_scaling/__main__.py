"""``python -m rope_scaling describe ...`` (see ``python -m rope_scaling describe --help``)."""
from __future__ import annotations

import sys

from ropescale.common.cli import Tool

from . import describe

TOOL = Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, ABF).",
            (describe.register,))
main = TOOL.entry()


if __name__ == "__main__":
    sys.exit(main())
