"""The probes command line: one subcommand per module, each exposing ``register(subparsers)``."""
from __future__ import annotations

import argparse
import importlib
import sys

from ropescale.io import cli_main

SUBCOMMANDS = ("probes.suffix_id", "probes.ppl", "probes.perturb", "probes.copy", "probes.shuffle", "probes.report")


def build_parser() -> argparse.ArgumentParser:
    import probes

    ap = argparse.ArgumentParser(prog="python -m probes", description=probes.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="PROBE")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return 2
    return args.func(args)
