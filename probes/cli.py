"""The probes command line: one subcommand per module, each exposing ``register(subparsers)``."""
from __future__ import annotations

import argparse

from common.io import cli_main, module_subcommands, run_subcommand

SUBCOMMANDS = ("probes.suffix_id", "probes.ppl", "probes.perturb", "probes.copy", "probes.shuffle", "probes.report")


def build_parser() -> argparse.ArgumentParser:
    import probes

    return module_subcommands("python -m probes", probes.__doc__, SUBCOMMANDS, metavar="PROBE")


@cli_main
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(build_parser(), argv)
