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
   length, is what ``experiments/bound.yaml`` trains), the fine-tune's answer loss at step 1 and over the last steps,
   ROUGE-L per length with n (eval samples, each under both prompts) and a 95 % t interval, the effective
   context length (NoLiMa's 85 % of 1x), the above-floor length (the longest length scoring at least the marks-only
   floor's highest upper bound) and retention (1x / the base model's 1x), under a floor row (the score of an answer
   holding only the four marks); B. IE - IB per length with its paired t interval and sign-flip permutation
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
import sys
from pathlib import Path

from ropescale.common.cli import cli_main
from ropescale.common.settings import add_settings, from_args

PROG = "python -m ropescale.demo"


def parser() -> argparse.ArgumentParser:
    """The demo's command line: a flag per setting of :class:`~ropescale.demo.steps.DemoSettings` and ``--recipe``;
    its usage names the command as called (``demo.py`` from scripts/demo.py)."""
    from .steps import DemoSettings

    prog = PROG if Path(sys.argv[0]).name == "__main__.py" else None
    ap = argparse.ArgumentParser(prog=prog, allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_settings(ap, DemoSettings, recipe_help="YAML file of these settings, e.g. out: runs/demo (flags "
                        "override it)")


@cli_main
def main(argv: list[str] | None = None) -> int:
    """Parse, then run the six steps (bad input: one ``error:`` line, exit code 2)."""
    from ropescale.common.process import prepare_process

    from . import run_demo

    settings = from_args(parser().parse_args(argv))
    prepare_process()  # an entry point like the CLIs it calls in-process: their library warnings filtered alike
    run_demo(settings)
    return 0
