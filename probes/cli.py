"""The probes command line: one subcommand per module (common.cli's style)."""
from __future__ import annotations

import argparse

from common.cli import Tool, cli_main

SUBCOMMANDS = ("probes.suffix_id", "probes.ppl", "probes.perturb", "probes.copy", "probes.shuffle", "probes.report")


def _tool() -> Tool:
    import probes

    return Tool("python -m probes", probes.__doc__, SUBCOMMANDS)


def build_parser() -> argparse.ArgumentParser:
    return _tool().parser()


@cli_main
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return _tool().main(argv, prog)
