"""``python -m rope_scaling describe ...`` (see ``python -m rope_scaling describe --help``)."""
from __future__ import annotations

import argparse
import sys

from common.io import cli_main

from . import describe as _describe


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rope_scaling",
                                 description="RoPE context extension (PI, NTK, dynamic NTK, YaRN, ABF).")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("describe", help="explain a RoPE setting per rotary dimension pair",
                       description=_describe.__doc__.split("\n\n", 1)[1].strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _describe.build_parser(p)
    args = ap.parse_args(argv)
    return _describe.run(args)


if __name__ == "__main__":
    sys.exit(main())
