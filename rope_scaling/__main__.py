"""``python -m rope_scaling describe|search ...`` (see ``python -m rope_scaling COMMAND --help``).

An entry point, on the front-door floor with ``ropescale.cli`` (it only dispatches): ``describe`` is this package's,
``search`` wires a model to the search (``ropescale.probes.rope_search``: the probes' data, model loading and scorer).
"""
from __future__ import annotations

import sys

from ropescale.common.cli import Tool
from ropescale.probes import rope_search

from . import describe

TOOL = Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, dynamic YaRN, ABF, "
            "Llama-3, LongRoPE): describe a setting, search LongRoPE factors.",
            (describe.register, rope_search.register))
main = TOOL.entry()


if __name__ == "__main__":
    sys.exit(main())
