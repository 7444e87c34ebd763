"""``python -m data_concat recall``: write the recall task's eval sets and training pairs (the task itself, its
format and samplers: :mod:`ropescale.common.recall`)."""
from __future__ import annotations

import json

import ropescale.common.recall as _task
from ropescale.common.chapters import read_chapters
from ropescale.common.cli import add_alias, add_command, add_json, add_overwrite
from ropescale.common.io import InputError, claim_output_file, write_jsonl_atomic
from ropescale.common.prompts import PROMPT_TYPES, STYLES
from ropescale.common.recall import HELDOUT, MARKS, PARTS, recall_samples, sources, split_part, total_tokens


def register(sub) -> None:
    p = add_command(sub, "recall", help="the demo's marked-sentence recall task (a long-range stand-in for CNNSum)",
                    description=_task.__doc__)
    p.add_argument("--chapters", default=None, help="chapters JSONL {book, chapter, title, text} "
                                                    "(default: the shared novels)")
    p.add_argument("--tokenizer", default="tiny", help="tokenizer directory, or 'tiny' (default)")
    p.add_argument("--eval-tokens", type=int, metavar="N",
                   help="eval set of total length N: for every --prompts, the rendered prompt (context included, "
                        "tokenized as eval_summ generate does) + the generation budget (--max-answer-tokens) <= N "
                        "tokens; one window in each of equal stretches of a book, never overlapping; records name "
                        "subset T<N>")
    add_alias(p, "--eval-tokens", "--target", type=int)
    p.add_argument("--max-answer-tokens", type=int, metavar="N",
                   help="eval set: the generation budget (eval_summ generate --max-new-tokens N), counted in "
                        "--eval-tokens; every reference plus EOS fits in N tokens (windows whose marked sentences "
                        "are longer are moved), so generating N new tokens can hold the whole answer")
    p.add_argument("--prompts", default="ft-ie,ft-ib", metavar="P,P",
                   help="eval set: the prompts it will be evaluated with, each counted whole in --eval-tokens "
                        "(default ft-ie,ft-ib, Appendix F.2; add ie,ib for the F.1 baseline prompts)")
    p.add_argument("--prompt-style", default="release", choices=STYLES,
                   help="wording of the F.1 prompts ie/ib in --prompts (default release, as eval_summ generate)")
    p.add_argument("--min-tokens", type=int, help="training pairs: context lengths drawn from this ...")
    p.add_argument("--max-tokens", type=int, help="... to this many tokens, at random places")
    p.add_argument("--n", type=int, default=24, help="number of samples (default 24)")
    p.add_argument("--marks", type=int, default=MARKS, help=f"marked sentences per sample (default {MARKS})")
    p.add_argument("--part", choices=PARTS, default="heldout",
                   help="which chapters: heldout (the last --heldout of each book, default), train (the rest), all")
    p.add_argument("--heldout", type=int, default=HELDOUT,
                   help=f"chapters held out at the end of each book (default {HELDOUT}, as the tiny default)")
    p.add_argument("--books", help="comma-separated book names (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed for where the windows start (eval sets: a seeded place "
                                                         "in each stretch; training pairs: anywhere) and which "
                                                         "sentences are marked")
    p.add_argument("--out", required=True, help="output JSONL {id, context, summary, book, chapters, tokens[, subset]}")
    add_json(p, "the report")
    add_overwrite(p)
    p.set_defaults(func=cmd_recall)


def cmd_recall(args) -> int:
    from ropescale.common.paths import CHAPTERS_JSONL

    from .tokenizer import load_tokenizer

    claim_output_file(args.out, overwrite=args.overwrite)
    if (args.eval_tokens is None) == (args.min_tokens is None and args.max_tokens is None):
        raise InputError("give either --eval-tokens (an eval set) or --min-tokens and --max-tokens (training pairs)")
    if args.max_answer_tokens is not None and args.eval_tokens is None:
        raise InputError("--max-answer-tokens goes with --eval-tokens (an eval set)")
    prompt_types = eval_prompts(args.prompts) if args.eval_tokens is not None else ()
    chs = split_part(read_chapters(args.chapters or CHAPTERS_JSONL, books=args.books), args.part, args.heldout)
    tok = load_tokenizer(args.tokenizer)
    kw = dict(n=args.n, target=args.eval_tokens, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
              marks=args.marks, seed=args.seed, prompts=prompt_types, style=args.prompt_style)
    try:
        rows = recall_samples(sources(chs, tok), tok, max_answer=args.max_answer_tokens, **kw)
    except InputError as err:
        raise shortfall(err, args, lambda: recall_samples(sources(chs, tok), tok, **kw), tok) from None
    write_jsonl_atomic(args.out, rows)
    lens = [r["tokens"] for r in rows]
    rep = {"samples": len(rows), "part": args.part, "marks": args.marks, "min": min(lens), "max": max(lens),
           "mean": round(sum(lens) / len(lens), 1), "books": sorted({r["book"] for r in rows}), "out": args.out}
    if prompt_types:
        budget = args.max_answer_tokens or 0
        rep["total_max"] = max(total_tokens(tok, r["context"], prompt_types, budget, args.prompt_style) for r in rows)
        rep["prompts"], rep["budget"] = list(prompt_types), budget
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
        return 0
    print(f"{rep['samples']} recall samples ({args.part} chapters, {args.marks} marks), context tokens "
          f"{rep['min']}-{rep['max']} (mean {rep['mean']}), books {', '.join(rep['books'])}")
    if prompt_types:
        print(f"total (longest of the prompts {', '.join(prompt_types)} + context + {rep['budget']} new tokens): "
              f"at most {rep['total_max']} of {args.eval_tokens}")
    print(f"wrote {args.out}")
    return 0


def shortfall(err: InputError, args, without_answer_cap, tok) -> InputError:
    """Too few samples fit: the cause in the flags of this command. When ``--max-answer-tokens`` is what rejects
    them (the samples fit without it: ``without_answer_cap()``), say so with the answer length they need; else the
    sampler's message with the flags named as this command spells them (``--eval-tokens``, not the library's
    ``target``)."""
    if not (args.max_answer_tokens is not None and err.message.startswith("only ")):
        return err
    try:
        rows = without_answer_cap()
    except InputError:
        return InputError(err.message.replace("a shorter --target", "a larger --eval-tokens"), err.path, err.line)
    need = max(_task.exact_tokens(tok, r["summary"]) + 1 for r in rows)
    return InputError(f"{err.message.split(' (use ')[0]}: the answers ({args.marks} marked sentences, end token "
                      f"included) take up to {need} tokens, more than --max-answer-tokens {args.max_answer_tokens} "
                      f"(a larger --max-answer-tokens or fewer --marks)", err.path, err.line)


def eval_prompts(spec: str) -> tuple[str, ...]:
    """``--prompts``: comma-separated prompt types (ie, ib, ft-ie, ft-ib), at least one."""
    got = tuple(dict.fromkeys(p.strip().lower() for p in spec.split(",") if p.strip()))
    bad = [p for p in got if p not in PROMPT_TYPES]
    if bad or not got:
        raise InputError(f"--prompts: expected some of {', '.join(PROMPT_TYPES)}, got {spec!r}")
    return got

