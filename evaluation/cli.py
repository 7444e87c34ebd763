"""eval_summ's command line: one subcommand per module, each module exposing ``register(subparsers)``.

A module's ``register`` adds its subparser and sets ``func`` (called with the parsed args, returns an exit code).
"""
from __future__ import annotations

import argparse

from common.io import cli_main, module_subcommands, run_subcommand

# subcommand modules, in --help order
SUBCOMMANDS = ("evaluation.generate", "evaluation.score", "evaluation.report", "evaluation.run_all")


def build_parser() -> argparse.ArgumentParser:
    return module_subcommands(
        "eval_summ.py", "CNNSum-exact long-context summarization evaluation: generate predictions, score them with "
                        "the official jieba ROUGE-L, and report Table-2 / extrapolation views.", SUBCOMMANDS)


@cli_main
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(build_parser(), argv)
