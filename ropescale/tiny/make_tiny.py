"""``ropescale make-tiny``: show the embedded tiny default model (the committed build in assets/tiny), or build one
from scratch with --build. Prints one JSON line: the model directory and what the model can do (ropescale.tiny)."""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from ropescale.common.cli import Tool, add_command, add_overwrite
from ropescale.common.io import InputError, claim_output_dir
from ropescale.common.models import ASSET_DIR, ASSET_JSON, MODEL_FILE, asset_info

from .build import DEFAULT_SPEC, build_tiny, built


def register(sub) -> None:
    p = add_command(sub, "make-tiny", help="build (or show) the embedded tiny default model", description=__doc__)
    p.add_argument("--build", action="store_true",
                   help="pretrain from scratch (default spec: about an hour on 2 CPU cores) and compare the "
                        "weights with the committed asset")
    p.add_argument("--out", help="where --build writes (default: the cache folder, .cache/tiny-<hash>)")
    p.add_argument("--steps", type=int, default=DEFAULT_SPEC.steps,
                   help=f"pretraining steps (default: {DEFAULT_SPEC.steps}; another value is another spec, built "
                        "into the cache by --build)")
    p.add_argument("--eval-every", type=int, default=0, help="with --build: log the copy effect every N steps")
    p.add_argument("--update-asset", action="store_true",
                   help="with --build of the default spec: replace assets/tiny with the new build")
    add_overwrite(p)
    p.set_defaults(func=cmd_make_tiny)


def cmd_make_tiny(args: argparse.Namespace) -> int:
    spec = DEFAULT_SPEC if args.steps == DEFAULT_SPEC.steps else replace(DEFAULT_SPEC, steps=args.steps)
    if args.update_asset and (spec != DEFAULT_SPEC or not args.build):
        raise InputError("--update-asset goes with --build of the default spec")
    if args.out is not None:  # the one output rule, before an hour of pretraining
        if not args.build:
            raise InputError("--out goes with --build (without it make-tiny writes nothing)")
        claim_output_dir(args.out, "--out", overwrite=args.overwrite)
    before = asset_info()  # what the committed asset was, to say whether a rebuild reproduced it
    if args.build:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON result: libraries log there
            d = build_tiny(spec, args.out, log=lambda m: print(m, file=sys.stderr), eval_every=args.eval_every)
        if args.update_asset:
            shutil.rmtree(ASSET_DIR, ignore_errors=True)
            shutil.copytree(d, ASSET_DIR)
    else:
        d = built(spec)
        if d is None:
            raise InputError(f"no build of this spec (steps {spec.steps}) yet: make-tiny --build makes one "
                             f"(the committed asset is the default spec's)")
    info = json.loads((Path(d) / ASSET_JSON).read_text(encoding="utf-8"))
    res = {"model": str(d), "params": info["params"], "ppl_heldout": round(info["ppl_heldout"], 2),
           "ppl_heldout_random": round(info["ppl_heldout_random"], 2), "copy_loss": info.get("copy_loss"),
           "nocopy_loss": info.get("nocopy_loss"), "recall_rouge_l": info.get("recall_rouge_l"),
           "sha256": info["sha256"][MODEL_FILE]}
    if args.build and before and before.get("key") == spec.key():
        res["identical_to_asset"] = before["sha256"][MODEL_FILE] == res["sha256"]
    print(json.dumps(res, ensure_ascii=False))
    return 0


TOOL = Tool("python -m ropescale make-tiny", __doc__, (register,), single=True)
main = TOOL.entry()
