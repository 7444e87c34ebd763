"""``python -m data_concat``: pack | stats | pairs | sample | recall, one module each (common.cli's style)."""
from __future__ import annotations

import argparse

from common.cli import Tool, cli_main

SUBCOMMANDS = ("data_concat.pack", "data_concat.packed", "data_concat.pairs", "data_concat.sampler",
               "data_concat.recall")
TOOL = Tool("python -m data_concat", "CNNSum-style data: pack fine-tuning samples (Sec 5), build pairs from the shared "
                                     "novels, sample multi-scale windows (Sec 3.2).", SUBCOMMANDS)


def build_parser() -> argparse.ArgumentParser:
    return TOOL.parser()


@cli_main
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return TOOL.main(argv, prog)
