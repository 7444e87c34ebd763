"""``python -m data_concat``: pack | stats | pairs | sample | recall | text | unique-marks, one module each
(ropescale.common.cli's style)."""
from __future__ import annotations

from ropescale.common.cli import Tool

from . import marks, packed, pairs, recall, sampler, text
from .pack import register as register_pack  # (the package's name ``pack`` is the pack function)

SUBCOMMANDS = (register_pack, packed.register, pairs.register, sampler.register, recall.register, text.register,
               marks.register)
TOOL = Tool("python -m data_concat", "CNNSum-style data: pack fine-tuning samples (Sec 5), build pairs from the shared "
                                     "novels, sample multi-scale windows (Sec 3.2).", SUBCOMMANDS)
build_parser = TOOL.parser
main = TOOL.entry()
