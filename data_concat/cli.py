"""``python -m data_concat``: pack | stats | pairs | sample | recall, one module each (ropescale.common.cli's style)."""
from __future__ import annotations

from ropescale.common.cli import Tool

SUBCOMMANDS = ("data_concat.pack", "data_concat.packed", "data_concat.pairs", "data_concat.sampler",
               "data_concat.recall")
TOOL = Tool("python -m data_concat", "CNNSum-style data: pack fine-tuning samples (Sec 5), build pairs from the shared "
                                     "novels, sample multi-scale windows (Sec 3.2).", SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
