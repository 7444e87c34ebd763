"""``python -m rope_scaling describe ...`` (see ``python -m rope_scaling describe --help``)."""
from __future__ import annotations

import sys

from common.cli import Tool, cli_main

TOOL = Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, ABF).",
            ("rope_scaling.describe",))


@cli_main
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return TOOL.main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
