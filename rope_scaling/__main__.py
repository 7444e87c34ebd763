"""``python -m rope_scaling describe|search ...`` (see ``python -m rope_scaling COMMAND --help``)."""
from __future__ import annotations

import sys

from ropescale.common.cli import Tool

from . import describe, search_cmd

TOOL = Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, dynamic YaRN, ABF, "
            "Llama-3, LongRoPE): describe a setting, search LongRoPE factors.",
            (describe.register, search_cmd.register))
main = TOOL.entry()


if __name__ == "__main__":
    sys.exit(main())
