"""eval_summ's command line: one subcommand per module, each module exposing ``register(subparsers)``.

A module's ``register`` adds its subparser and sets ``func`` (called with the parsed args, returns an exit code).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ropescale.io import cli_main

# subcommand modules, in --help order
SUBCOMMANDS = ("evaluation.generate", "evaluation.score", "evaluation.report", "evaluation.run_all")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eval_summ.py",
        description="CNNSum-exact long-context summarization evaluation: generate predictions, score them with "
                    "the official jieba ROUGE-L, and report Table-2 / extrapolation views.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # a subcommand not built yet
                continue
            raise
        mod.register(sub)
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return 2
    return args.func(args)
