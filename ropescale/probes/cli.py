"""The probes command line: one subcommand per module (ropescale.common.cli's style)."""
from __future__ import annotations

from ropescale import probes
from ropescale.common.cli import Tool
from ropescale.evaluation.report.cli import register_probes as register_report  # the one report stack

from . import continuation, copy, passkey, perturb, position_loss, ppl, shuffle, suffix_id
from .ruler import probe as ruler

# each subcommand's register, in --help order
SUBCOMMANDS = (suffix_id.register, ppl.register, perturb.register, copy.register, shuffle.register, ruler.register,
               passkey.register, position_loss.register, continuation.register, register_report)
TOOL = Tool("ropescale probes", probes.__doc__, SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
