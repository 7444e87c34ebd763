"""The one ``ropescale`` command: ``ropescale TOOL ...`` runs a tool with the same flags as its entry script.

    ropescale rope describe ...     = python -m rope_scaling describe ...
    ropescale data pack ...         = python -m data_concat pack ...
    ropescale finetune [train] ...  = python finetune.py ...   (multi-GPU: deepspeed finetune.py ...)
    ropescale eval generate ...     = python eval_summ.py generate ...
    ropescale probes ppl ...        = python -m ropescale.probes ppl ...
    ropescale make-tiny ...         = python -m ropescale make-tiny ...
"""
from __future__ import annotations

import importlib
import sys

# tool -> (module with main(argv, prog), a common.cli.Tool's entry; what it does); in --help order
TOOLS = {
    "rope": ("rope_scaling.__main__", "RoPE settings: describe what a method does to each rotary pair"),
    "data": ("data_concat.cli", "data: pack fine-tuning samples, build pairs, sample CNNSum-style eval sets"),
    "finetune": ("ropescale.training.cli", "LoRA fine-tuning with RoPE scaling ([train]), merge a run into a model"),
    "eval": ("ropescale.evaluation.cli", "CNNSum evaluation: generate, score, report, run"),
    "probes": ("ropescale.probes.cli", "long-context probes and their report"),
    "make-tiny": ("ropescale.tiny.make_tiny", "build (or show) the embedded tiny default model"),
}


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
    module = importlib.import_module(TOOLS[name][0])
    return module.main(rest, prog=f"ropescale {name}")
