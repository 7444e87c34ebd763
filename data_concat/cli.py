"""``python -m data_concat``: pack | stats | pairs | sample. Each subcommand only parses and calls a function."""
from __future__ import annotations

import argparse
import json
import sys

from ropescale.io import cli_main

EPILOG_PACK = """\
Each pair {context, summary[, id, book]} becomes: the Appendix F.2 prompt rendered around the context (no loss),
then the summary tokens and EOS (loss). Pairs are shuffled with --seed and concatenated into samples whose
length lies in [min, max] (16k = 14336-18432, 32k = 30720-34816 tokens); samples are not padded. Pairs that
do not fit anywhere are reported as leftover; bad records stop the run (--on-bad error) or are counted
(--on-bad skip). OUT (replaced atomically) holds train.parquet, meta.json and stats.json.
"""


def _add_tokenizer(p):
    p.add_argument("--tokenizer", default="tiny",
                   help="tokenizer directory (an HF model dir works), or 'tiny' for the embedded tiny default "
                        "(default: tiny)")


def _add_on_bad(p):
    p.add_argument("--on-bad", choices=("error", "skip"), default="error",
                   help="malformed or empty records (and, for pack, pairs longer than --max): stop with "
                        "FILE:LINE (error, default) or skip and count them (skip)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m data_concat",
                                 description="CNNSum-style data: pack fine-tuning samples (Sec 5), build pairs "
                                             "from the shared novels, sample multi-scale windows (Sec 3.2).")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("pack", help="pack summarization pairs into long training samples",
                       description="Pack summarization pairs into 14-18K / 30-34K token training samples "
                                   "(CNNSum Sec 5).", epilog=EPILOG_PACK,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", required=True, help="JSONL of {context, summary[, id, book]}")
    _add_tokenizer(p)
    p.add_argument("--target", choices=("16k", "32k"), help="length preset: 16k = 14K-18K, 32k = 30K-34K (K=1024)")
    p.add_argument("--min", type=int, dest="min_len", help="minimum sample length in tokens (overrides --target)")
    p.add_argument("--max", type=int, dest="max_len", help="maximum sample length in tokens (overrides --target)")
    p.add_argument("--prompt", choices=("ft-ie", "ft-ib", "mix", "ie", "ib"), default="mix",
                   help="Appendix F.2 fine-tuning prompt (the names eval_summ uses): ft-ie, ft-ib, or mix (a seeded "
                        "random choice per pair, default: the paper evaluates fine-tuned models with both); ie / ib "
                        "are deprecated aliases of ft-ie / ft-ib")
    p.add_argument("--seed", type=int, default=0, help="seed of the random concatenation (default 0)")
    p.add_argument("--out", required=True, help="output directory (replaced atomically); "
                                                "datasets.load_dataset(OUT, split='train') reads it")
    _add_on_bad(p)
    p.add_argument("--json", action="store_true", help="print the stats as JSON")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("stats", help="print the stats of a packed directory")
    p.add_argument("out", help="a directory written by pack")
    p.add_argument("--json", action="store_true", help="print the stats as JSON")
    p.set_defaults(func=cmd_stats)

    from . import pairs as pairs_mod
    from . import recall as recall_mod
    from . import sampler as sampler_mod

    pairs_mod.register(sub)
    sampler_mod.register(sub)
    recall_mod.register(sub)
    return ap


def cmd_pack(args) -> int:
    from .pack import format_stats, load_meta, pack

    stats = pack(args.pairs, args.tokenizer, args.out, target=args.target, min_len=args.min_len,
                 max_len=args.max_len, prompt=args.prompt, seed=args.seed, on_bad=args.on_bad,
                 progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
    else:
        print(format_stats(stats, load_meta(args.out)))
        print(f"wrote {args.out}")
    if stats["samples"] == 0:
        print(f"warning: no sample reached the minimum length; {stats['leftover']} pair(s) left over",
              file=sys.stderr)
    return 0


def cmd_stats(args) -> int:
    from .pack import format_stats, load_meta, stats_of

    stats = stats_of(args.out)
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
    else:
        print(format_stats(stats, load_meta(args.out)))
    return 0


@cli_main
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
