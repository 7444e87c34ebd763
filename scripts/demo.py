#!/usr/bin/env python
"""The end-to-end demo (``make demo``, README command (1)): extend the tiny default's 512-token context x8 with each
RoPE method, with and without fine-tuning, and evaluate extrapolation the CNNSum way, on a CPU in minutes. Every
step prints the command it runs.

1. the embedded tiny default (``python -m ropescale make-tiny``: the committed build in assets/tiny, a 3.5M-parameter
   Qwen2-architecture model with a 512-token context that copies and does the recall task inside its context);
2. data (``python -m data_concat recall``): the recall task (sentences marked 【1】..【4】 spread over a novel excerpt,
   the marked sentences in order as the reference; see data_concat/recall.py) — training pairs of 2x-4x the original
   context from the training chapters, packed with ``python -m data_concat pack`` (F.2 prompts, loss on the
   answers); eval sets at 1x, 2x, 4x, 8x the original context from the held-out chapters (never trained on);
3. ``deepspeed finetune.py --rope M --scale 8 --data PACK --out OUT/train/tiny-M-x8`` for each method of
   ``--methods`` (default ntk, yarn; none = the same fine-tune without RoPE scaling), then ``python finetune.py
   merge``;
4. ``eval_summ.py generate``, greedy, every length, for: the base model; the base model with each method applied
   at load time (``--rope M --scale 8``, no fine-tune: what the method alone does); every fine-tuned model — all
   with both F.2 prompts (ft-ie / ft-ib, those of the pre-training and the fine-tunes) — and the base model with
   the F.1 baseline prompts (ie / ib, as the paper's Table 2 evaluates its baselines) inside its window (1x: past
   it the unscaled base model is below the floor with any prompt);
5. ``eval_summ.py report``: CNNSum ROUGE-L of every run, the extrapolation table, Table 2's IE/IB averages and
   MSE, the exact recall per mark when the report writes it (recall.md), the failure modes (OUT/report/) and
   the Fig. 3 plot (OUT/fig3.png); the F.1 runs get their own report (OUT/report/baseline_prompts/), so the two
   prompt families are never averaged together;
6. the demo's own tables (OUT/report/demo.md): A. per row its angle bound (``formulas.reach``, or
   ``formulas.finetune_bound`` with the fine-tune's longest trained sample for a fine-tuned row: the longest context
   in which every rotary pair stays inside angles it saw -- a necessary condition, not a prediction) beside Liu et
   al. 2023's closed form for the base-change rows (its premise, a fine-tune with the new base at the original
   length, is what ``scripts/bound_tiny.py`` trains), the fine-tune's answer loss at step 1 and over the last steps,
   ROUGE-L per length with n (eval samples, each under both prompts) and a 95 % bootstrap interval, the effective
   context length (NoLiMa's 85 % of 1x), the above-floor length (the longest length scoring at least the marks-only
   floor's highest upper bound) and retention (1x / the base model's 1x), under a floor row (the score of an answer
   holding only the four marks); B. IE - IB per length with its paired bootstrap interval and sign-flip permutation
   p, MSE(P-IE vs P-IB) beside its noise floor with its permutation p and the chance that a row with no prompt
   effect reaches the paper's red mark (MSE >= 5); C. the differences the readings compare (a row against another
   on the same eval samples), each with its interval and paired sign-flip p
   (``ropescale/common/stats/tests.py``).

Every eval length is a total: the rendered prompt + context + the generation budget fit in it
(``data_concat recall --eval-tokens T --max-answer-tokens N``), so the 1x column is inside the original window.
The recall task stands in for CNNSum's human-written summaries, which a model this small cannot write: every
reference line is copied from its input and the marks are spread evenly, so a model that cannot reach part of the
input loses the lines there. ROUGE-L on it has a floor of about 20 (the marks and line breaks alone), not 0.
Re-running reuses what is finished (data, fine-tuned models, finished generations); ``--fresh`` starts over.
``--seed`` changes the fine-tuning seed, the training pairs, the eval passages and their marked sentences.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the steps, rows and tables live in ropescale/demo/ (importing it sets the demo's process environment first)
from ropescale.demo import FREE, METHODS, run_demo  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="where everything goes (default runs/demo)")
    ap.add_argument("--model", default="tiny", help="'tiny' (default) or an HF model directory")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="RoPE methods to fine-tune (default ntk,yarn; none,pi,ntk,yarn adds the fine-tune without "
                         "scaling and PI's, about 5 minutes more on 2 CPU cores)")
    ap.add_argument("--free", default=",".join(FREE),
                    help="RoPE methods to evaluate applied at load time, without fine-tuning (default pi,ntk,yarn; "
                         "'' for none)")
    ap.add_argument("--scale", type=float, default=8, help="scale factor of every method (default 8)")
    ap.add_argument("--factors", default="1,2,4,8", help="eval lengths as multiples of the original context")
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=128,
                    help="the references are four marked sentences (~100 tokens), so 128 rather than 400; the eval "
                         "sets hold only references that fit (data_concat recall --max-answer-tokens)")
    ap.add_argument("--pairs", type=int, default=256, help="fine-tuning pairs (default 256)")
    ap.add_argument("--launcher", default="deepspeed", choices=("deepspeed", "python"))
    ap.add_argument("--finetune-args", default="", help="extra finetune.py flags, e.g. '--max-steps 4'")
    ap.add_argument("--no-baseline-prompts", action="store_true",
                    help="skip the base model's runs with the F.1 baseline prompts (ie / ib; at 1x only)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the fine-tunes, the training pairs, the eval passages and their marks")
    ap.add_argument("--fresh", action="store_true", help="remove earlier demo outputs first")
    args = ap.parse_args(argv)
    from ropescale.common.io import InputError
    from ropescale.common.process import prepare_process

    prepare_process()  # an entry point like the CLIs it calls in-process: their library warnings filtered alike

    try:
        run_demo(args.out, model=args.model, methods=[m for m in args.methods.split(",") if m],
                 free=[m for m in args.free.split(",") if m], scale=args.scale,
                 factors=[float(x) for x in args.factors.split(",")], samples=args.samples,
                 max_new_tokens=args.max_new_tokens, pairs=args.pairs, launcher=args.launcher,
                 finetune_args=shlex.split(args.finetune_args), seed=args.seed,
                 baseline_prompts=not args.no_baseline_prompts, fresh=args.fresh)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
