"""``python -m rope_scaling describe ...`` (see ``python -m rope_scaling describe --help``)."""
from __future__ import annotations

import sys

from ropescale.common.cli import Tool

TOOL = Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, ABF).",
            ("rope_scaling.describe",))
main = TOOL.entry()


if __name__ == "__main__":
    sys.exit(main())
