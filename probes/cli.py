"""The probes command line: one subcommand per module (common.cli's style)."""
from __future__ import annotations

import probes
from common.cli import Tool

SUBCOMMANDS = ("probes.suffix_id", "probes.ppl", "probes.perturb", "probes.copy", "probes.shuffle", "probes.report")
TOOL = Tool("python -m probes", probes.__doc__, SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
