"""The probes command line: one subcommand per module (ropescale.common.cli's style)."""
from __future__ import annotations

from ropescale import probes
from ropescale.common.cli import Tool

SUBCOMMANDS = tuple(f"ropescale.probes.{m.replace('-', '_')}" for m in (*probes.PROBES, "report"))
TOOL = Tool("ropescale probes", probes.__doc__, SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
