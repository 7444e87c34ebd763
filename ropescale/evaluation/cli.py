"""eval_summ's command line: one subcommand per module (ropescale.common.cli's style)."""
from __future__ import annotations

from ropescale.common.cli import Tool

from . import generate, run_all, score
from .report import cli as report

# each subcommand's register, in --help order
SUBCOMMANDS = (generate.register, score.register, report.register, run_all.register)
TOOL = Tool("eval_summ.py", "CNNSum-exact long-context summarization evaluation: generate predictions, score them "
                            "with the official jieba ROUGE-L, and report Table-2 / extrapolation views.", SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
