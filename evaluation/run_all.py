"""``eval_summ run``: generate + score + report in one command.

    python eval_summ.py run --model PATH|tiny --data FILE.jsonl --prompt ie --out DIR [generate flags]
                            [--metric cnnsum|standard] [--with RUN_DIR ...] [--plot FIG.png] [--report-out DIR]

1. ``generate`` into DIR (resumable: re-running continues where a killed run stopped);
2. ``score`` DIR (writes DIR/scores.json and DIR/sample_scores.jsonl);
3. ``report`` DIR together with any ``--with`` run directories (or folders of them): prints the tables
   (Table 2 / Table 7 / extrapolation / failure modes), optionally writes them (``--report-out``) and the
   Fig. 3 PNG (``--plot``).
"""
from __future__ import annotations

import argparse
import json
import sys

from .generate import add_generate_args, generate, generate_kwargs


def run(*, metric: str = "cnnsum", with_runs=(), plot=None, report_out=None, buckets=None, log=None,
        **gen_kwargs) -> dict:
    """Generate (``gen_kwargs`` as :func:`evaluation.generate.generate`), score, and build the report.
    Returns {"generate": ..., "score": scores.json summary, "report": the tables as markdown}."""
    from .report import make_report
    from .score import score_run

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    gen = generate(**gen_kwargs, log=log)
    log(f"[run] scoring {gen['out']} ({metric} ROUGE-L)")
    summary = score_run(gen["out"], metric)
    log(f"[run] ROUGE-L {summary['rouge_l']:.2f} over {summary['n']} samples")
    text = make_report([gen["out"], *with_runs], metric=metric, buckets=buckets, out_dir=report_out, plot=plot)
    return {"generate": gen, "score": summary, "report": text}


def _main(args) -> int:
    from .report import parse_buckets

    res = run(metric=args.metric, with_runs=args.with_runs, plot=args.plot, report_out=args.report_out,
              buckets=parse_buckets(args.buckets) if args.buckets else None, **generate_kwargs(args))
    if args.json:
        print(json.dumps({k: res[k] for k in ("generate", "score")}, ensure_ascii=False))
    else:
        sys.stdout.write(res["report"])
    return 0


def register(subparsers) -> None:
    from .rouge import DEFAULT_METRIC, METRICS

    p = subparsers.add_parser("run", help="generate + score + report in one (resumable)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(p)
    p.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC, help="ROUGE-L flavour (default: cnnsum)")
    p.add_argument("--with", dest="with_runs", nargs="*", default=[], metavar="RUN_DIR",
                   help="other run directories (or folders of them) to report alongside this one")
    p.add_argument("--buckets", metavar="EDGES", help="extrapolation columns by input length, e.g. 512,1024,2048")
    p.add_argument("--plot", metavar="FIG.png", help="write the Fig. 3 plot of the reported runs")
    p.add_argument("--report-out", metavar="DIR", help="also write every table as DIR/<view>.{md,csv,json}")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the tables")
    p.set_defaults(func=_main)

