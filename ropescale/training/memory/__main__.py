"""``python -m ropescale.training.memory --plan N | --reach``: the memory planner's choice for one sample
(:func:`ropescale.training.memory.plan.choose`) and the longest sample each family of plans fits
(:mod:`ropescale.training.memory.reach`), for the 7B Qwen1.5 shape on the recipe path: a model, not a measurement."""
from __future__ import annotations

from ropescale.common.cli import Tool, add_command
from ropescale.common.forward_memory import GIB

from .estimate import Setup
from .plan import Machine, NoFit, choose
from .reach import print_reach


def register(sub) -> None:
    p = add_command(sub, "memory-plan", help="the memory planner's choice for a 7B LoRA fine-tune on one GPU",
                       description="The memory planner (a model, not a measurement) for the 7B Qwen1.5 shape on the "
                                   "recipe path (ZeRO-3, LoRA r=8 + embeddings + norms, bf16): --plan N: the "
                                   "fastest plan that fits a sample of N tokens on one GPU with the given memory; "
                                   "--reach: the longest sample each family of plans fits on one H200 (139.8 GiB) "
                                   "and one H100 80GB (79.6 GiB), each with 125 GiB of host memory.")
    p.add_argument("--plan", type=int, metavar="TOKENS", help="plan one sample of TOKENS tokens")
    p.add_argument("--reach", action="store_true", help="the longest sample of each family of plans")
    p.add_argument("--gpu-gib", type=float, default=139.8, help="free GPU memory in GiB, with --plan (default: 139.8)")
    p.add_argument("--host-gib", type=float, default=125.0, help="available host memory in GiB, with --plan "
                   "(default: 125)")
    p.add_argument("--label-share", type=float, default=0.1, help="labelled share of the tokens (default: 0.1)")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.set_defaults(func=cmd_memory_plan)


def cmd_memory_plan(a) -> int:
    import json
    import sys

    from .estimate import QWEN15_7B

    if not a.plan and not a.reach:
        print("error: give --plan TOKENS or --reach", file=sys.stderr)
        return 2
    if a.plan:
        m = Machine(f"one GPU of {a.gpu_gib:g} GiB + {a.host_gib:g} GiB host", int(a.gpu_gib * GIB),
                    int(a.host_gib * GIB))
        try:
            c = choose(QWEN15_7B, Setup(length=a.plan, label_share=a.label_share), m)
        except NoFit as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        rec = c.record() | {"tokens_per_s": round(a.plan / c.seconds["step"], 1)}
        print(json.dumps(rec) if a.json else f"{c.plan.describe()}\n{c.estimate.describe()}\n"
              f"~{c.seconds['step']:.1f} s a step, {rec['tokens_per_s']:,.0f} tok/s (the time model)")
        return 0
    return print_reach(a.label_share, a.json)


TOOL = Tool("python -m ropescale.training.memory", __doc__, (register,), single=True)
main = TOOL.entry()

if __name__ == "__main__":
    import sys

    sys.exit(main())
