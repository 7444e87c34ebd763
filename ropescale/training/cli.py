"""finetune.py's command line: ``finetune.py [train] FLAGS``, ``finetune.py merge --run DIR --out DIR`` and
``finetune.py plot RUN``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ropescale.common.cli import (
    Tool,
    add_command,
    add_dtype,
    add_json,
    add_out,
    add_overwrite,
    add_resume,
    doc_sections,
    print_result,
)

DESCRIPTION = """\
LoRA fine-tuning with RoPE scaling on packed long samples (CNNSum Sec 5 / App. B.2).

  deepspeed finetune.py --rope ntk --scale 8          # tiny default model + data built from the novels
  python finetune.py --rope pi --scale 4              # the same without the launcher (one process)
  deepspeed finetune.py --model /path/Qwen1.5-7B --data PACKED --deepspeed ds_configs/zero3_offload.json \\
      --rope ntk --scale 8                            # the paper's run
  python finetune.py --recipe recipes/qwen1.5-7b_ntk-x8_16k.yaml --model /path/Qwen1.5-7B --data PACKED
  python finetune.py merge --run runs/train/tiny-ntk-x8 --out models/tiny-ntk-x8    # plot RUN: its curves (PNG)
"""

TRAIN_DESCRIPTION = """\
LoRA r=8 on q,k,v,o plus the embeddings and every norm, loss on the summaries only (the LM head runs only at
labelled positions), AdamW 2e-5 with 30 warm-up steps, global batch 16 (16K) / 8 (32K), gradient checkpointing,
optional DeepSpeed ZeRO-2/3 with CPU offload.

Settings: defaults < --recipe FILE (YAML, the same keys with underscores) < flags. Without --recipe, the tiny default
model uses recipes/tiny_demo.yaml (a few steps). The run directory gets run.json, train_log.jsonl, checkpoint-N/
(--resume auto continues from the newest; each with an export/), final/ (the export), config.json with the RoPE setting
and train_curves.png (the loss and learning rate per step). The default run directory is
runs/train/<model>-<rope>-x<scale> under the current directory. Prints the run directory on stdout at the end (--json: a
summary). A directory holding a run is never reused silently: a finetune run continues only with --resume auto (the same
settings and model; only --max-steps may grow) and is deleted only with --overwrite; another kind of run (an eval or
probe run directory) is never written into.
"""


def register_train(sub) -> None:
    from .config import add_train_args

    p = add_command(sub, "train", help="fine-tune (the default command)",
                    **doc_sections(TRAIN_DESCRIPTION, 1, more="docs/usage.md (finetune)"))
    add_resume(p, "never", checkpoint=True)
    p.add_argument("--overwrite", action="store_true",
                   help="start over: the run in --out and its checkpoints are deleted")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_json(p, "a summary (run directory, steps, seconds)")
    add_train_args(p)
    p.set_defaults(func=cmd_train)


def register_merge(sub) -> None:
    p = add_command(sub, "merge", help="merge a run into a plain HF model directory",
                    description="Merge a run's adapter + trained embedding/norm tensors into its base model: a plain "
                                "HF model directory (safetensors) whose config carries the RoPE setting, with the "
                                "run's training record in ropescale_train.json (RoPE spec, data and its length "
                                "mean/min/max, steps, base model) that every later run reading the model records.")
    p.add_argument("--run", required=True, help="finetune run directory (or an export directory)")
    add_out(p, "output model directory: a new or empty directory (written atomically: nothing is left on "
               "failure); an existing model directory only with --overwrite", metavar="DIR")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model directory --out holds (atomically, once the merge has succeeded)")
    p.add_argument("--step", type=int, default=None, help="merge checkpoint-STEP's export instead of the final one")
    p.add_argument("--base-model", default=None, help="base model directory; default: the one the run used")
    add_dtype(p, "the base config's dtype")
    add_json(p)
    p.set_defaults(func=cmd_merge)


def register_plot(sub) -> None:
    p = add_command(sub, "plot", help="draw a run's loss and learning rate per step (PNG)",
                    description="Draw the loss and the learning rate of each logged step of a finetune run (its "
                                "train_log.jsonl; also a run that was stopped) into RUN/train_curves.png, the figure "
                                "a fine-tune draws when it ends. Prints the PNG's path.")
    p.add_argument("run", nargs="?", metavar="RUN", help="finetune run directory")
    p.add_argument("--run", dest="run_flag", metavar="DIR", help="the same as RUN")
    add_out(p, "where to write the PNG (default: RUN/train_curves.png)", required=False, metavar="FILE.png")
    add_overwrite(p)
    add_json(p, "the PNG's path and the steps drawn")
    p.set_defaults(func=cmd_plot)


TOOL = Tool("finetune.py", DESCRIPTION, (register_train, register_merge, register_plot), default="train")


def cmd_train(args) -> int:
    from .config import settings_from_args
    from .run import train

    settings, recipe = settings_from_args(args)
    result = train(settings, recipe=recipe, resume=args.resume, overwrite=args.overwrite)
    if result is not None:  # rank 0
        print(json.dumps(result, ensure_ascii=False) if args.json else result["run"], flush=True)
    _shutdown_dist()
    return 0


def cmd_merge(args) -> int:
    from .saving import EXPORT_JSON, find_export, merge

    src = Path(args.run)
    exp = src if (src / EXPORT_JSON).is_file() and args.step is None else find_export(src, args.step)
    out = merge(exp, args.out, base_model=args.base_model, dtype=args.dtype, overwrite=args.overwrite)
    print(json.dumps({"model": str(out), "export": str(exp)}) if args.json else str(out))
    return 0


def cmd_plot(args) -> int:
    from ropescale.common.io import InputError, check_output_file, claim_output_file

    from .curves import CURVES_PNG, plot_curves, read_log

    if args.run and args.run_flag and args.run != args.run_flag:
        raise InputError(f"two run directories given ({args.run} and --run {args.run_flag}): give one")
    run = args.run or args.run_flag
    if not run:
        raise InputError("plot needs the run directory: finetune.py plot RUN")
    own = Path(run) / CURVES_PNG
    if args.out and Path(args.out).resolve() != own.resolve():  # replaced only when this tool wrote it (or --overwrite)
        out = claim_output_file(args.out, overwrite=args.overwrite, suffix=".png")
    else:  # the run's own figure, which the fine-tune wrote
        out = check_output_file(own)
    png = plot_curves(run, out)
    return print_result({"png": str(png), "steps": len(read_log(run))}, args.json, str(png))


main = TOOL.entry()


def _shutdown_dist() -> None:
    """Tear the process group down before the interpreter exits: left to interpreter shutdown, gloo's threads are
    sometimes destroyed while joinable and the process aborts ("terminate called without an active exception",
    exit 250) after a successful run."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
