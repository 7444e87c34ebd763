"""eval_summ's command line: one subcommand per module (common.cli's style)."""
from __future__ import annotations

from common.cli import Tool

# subcommand modules, in --help order
SUBCOMMANDS = ("evaluation.generate", "evaluation.score", "evaluation.report", "evaluation.run_all")
TOOL = Tool("eval_summ.py", "CNNSum-exact long-context summarization evaluation: generate predictions, score them "
                            "with the official jieba ROUGE-L, and report Table-2 / extrapolation views.", SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
