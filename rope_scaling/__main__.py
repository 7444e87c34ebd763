"""``python -m rope_scaling describe|search ...`` (see ``python -m rope_scaling COMMAND --help``).

An entry point, on the front-door floor with ``ropescale.cli``; the tool is wired by ``ropescale.commands.rope_tool``:
``describe`` is this package's, ``search`` a stage's (``ropescale.probes.rope_search``: the probes' data, model
loading and scorer). Nothing else in this package imports a stage.
"""
from __future__ import annotations

import sys

from ropescale.commands import rope_tool

TOOL = rope_tool()
main = TOOL.entry()


if __name__ == "__main__":
    sys.exit(main())
