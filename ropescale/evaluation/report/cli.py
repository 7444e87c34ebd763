"""The report commands, ``eval_summ.py report`` and ``ropescale probes report``: flags, the checks before anything is
written (one :func:`check_report_out` for both), the files they write (the one table writer, the one PNG writer)."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ropescale.common.cli import add_command, add_format, add_overwrite
from ropescale.common.io import InputError, claim_output_dir, claim_output_file, write_text_atomic
from ropescale.common.rouge import DEFAULT_METRIC, METRICS

from . import __doc__ as report_doc
from . import probes
from .intake import build_report, load_probe_runs, save_fresh_scores
from .model import Report, parse_buckets
from .plot import plot_fig3, series_from_runs
from .probes import plot_probes, render_probes, write_probe_tables
from .render import VIEWS, Options, render, write_report

TABLE_SUFFIXES = (".md", ".csv", ".json", ".txt")  # probes report --out FILE: the old spelling (one table file)

EXAMPLES = """\
examples:
  eval_summ.py report --scores scores.csv                   # Table 2 + Table 7 views (markdown)
  eval_summ.py report --scores scores.csv --json            # {model: {avg: {subset: v}, mse: v}}
  eval_summ.py report runs/ --plot fig3.png --out tables/   # every view + Fig. 3 from run dirs
  eval_summ.py report runs/ --buckets 1024,2048,4096 --view extrapolation --format csv
  eval_summ.py report runs/ --effective-threshold 30   # also the longest length scoring >= 30 (RULER's rule)"""


def register(subparsers) -> argparse.ArgumentParser:
    p = add_command(subparsers, "report", help="Table 2 / Table 7 / extrapolation / failure-mode tables (+ Fig. 3 PNG)",
                    description=report_doc.split("Importable:")[0], epilog=EXAMPLES)
    p.add_argument("paths", nargs="*", metavar="RUN_DIR|FILE.csv",
                   help="run directories (or folders holding them) and/or scores CSV files")
    p.add_argument("--scores", action="append", default=[], metavar="FILE.csv",
                   help="CSV with columns model,prompt,subset,rouge_l (repeatable)")
    add_format(p)
    p.add_argument("--view", choices=VIEWS, default=None,
                   help="which table to print; default: all for markdown, table2 for csv and json")
    p.add_argument("--buckets", metavar="EDGES", default=None,
                   help="extrapolation columns by input length: comma-separated token edges, e.g. 512,1024,2048")
    p.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC,
                   help="metric for runs that must be scored (default: cnnsum)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="write the Fig. 3 plot: per-sample ROUGE-L vs input length, each column's mean with its "
                        "interval")
    p.add_argument("--window", type=int, default=15,
                   help="moving-median window of --plot, drawn only where every column has that many samples "
                        "(default: 15)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="also write every view as DIR/<view>.{md,csv,json}")
    p.add_argument("--no-save-scores", action="store_true",
                   help="do not write scores.json / sample_scores.jsonl into runs scored on the fly")
    p.add_argument("--no-intervals", dest="intervals", action="store_false",
                   help="markdown cells without their 95%% interval (JSON and CSV always carry n and the "
                        "interval; markdown has them by default)")
    add_overwrite(p, "--out / --plot")
    p.add_argument("--intervals", dest="intervals", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--effective-threshold", type=float, metavar="X", default=None,
                   help="also the longest length up to which a row scores >= X (a fixed threshold: RULER's rule, and "
                        "RULER's effective length when X is, as there, a reference model's score on the task; "
                        "NoLiMa's, >= 85%% of the row's first column, is always shown)")
    p.add_argument("--resamples", type=int, metavar="N", default=None,
                   help="bootstrap resamples of the MSE's interval (default 2000; same input and N, same "
                        "interval; a mean's t interval draws nothing)")
    p.set_defaults(func=cmd_report)
    return p


def plot_report(rep: Report, path: str | os.PathLike, window: int = 15) -> Path:
    """The Fig. 3 PNG of the report's runs (per-sample ROUGE-L vs input length; each column's mean and interval, as
    the tables have them; a moving median only where each column has ``window`` samples)."""
    if not rep.runs:
        raise InputError("--plot needs run directories (per-sample scores with input lengths)")
    return plot_fig3(series_from_runs(rep.runs, rep), path, window=window)




def check_report_out(out_dir=None, plot=None, *, overwrite: bool = False) -> None:
    """Where a report goes must be usable before anything is written (the one output rule,
    ``ropescale.common.io.claim_output_file``): ``out_dir`` a new or empty directory or one of reports this tool
    wrote, ``plot`` a ``.png`` path that is new or this tool's (else only with ``overwrite``)."""
    if out_dir is not None:
        claim_output_dir(out_dir, "--out", overwrite=overwrite, whole=False)
    if plot is not None:
        claim_output_file(plot, "--plot", overwrite=overwrite, suffix=".png")


def make_report(sources: Iterable[Any] = (), *, scores_csv: Iterable[str | os.PathLike] = (),
                metric: str = DEFAULT_METRIC, buckets: Optional[Sequence[int]] = None, fmt: str = "markdown",
                view: Optional[str] = None, out_dir: Optional[str | os.PathLike] = None,
                plot: Optional[str | os.PathLike] = None, window: int = 15, save_scores: bool = True,
                intervals: bool = True, effective_threshold: Optional[float] = None,
                resamples: Optional[int] = None, overwrite: bool = False) -> str:
    """Everything ``eval_summ.py report`` does, as one call (``eval_summ.py run`` uses it): build the views,
    validate every input, then save recomputed run scores, write ``out_dir`` tables and the ``plot`` PNG, and
    return the text to print. Bad input raises InputError before anything is written."""
    if window < 1:
        raise InputError("--window must be >= 1")
    if resamples is not None and resamples < 1:
        raise InputError(f"--resamples must be >= 1, got {resamples}")
    if effective_threshold is not None and not math.isfinite(effective_threshold):
        raise InputError(f"--effective-threshold must be a number, got {effective_threshold}")
    check_report_out(out_dir, plot, overwrite=overwrite)
    rep = build_report(sources, scores_csv=scores_csv, metric=metric, buckets=buckets, resamples=resamples)
    opts = Options(intervals, effective_threshold)
    if buckets and not rep.runs:
        raise InputError("--buckets needs run directories (per-sample input lengths)")
    if plot:
        if not rep.runs:
            raise InputError("--plot needs run directories (per-sample scores with input lengths)")
        if not series_from_runs(rep.runs):
            raise InputError("--plot: no sample of these runs has input_tokens")
    view = view or ("all" if fmt == "markdown" else "table2")
    text = render(rep, fmt, view, opts)  # every check before the first write
    if save_scores:
        save_fresh_scores(rep)
    if out_dir:
        for p in write_report(rep, out_dir, opts):
            print(f"wrote {p}", file=sys.stderr)
    if plot:
        print(f"wrote {plot_report(rep, plot, window)}", file=sys.stderr)
    return text


def cmd_report(args: argparse.Namespace) -> int:
    text = make_report(args.paths, scores_csv=args.scores, metric=args.metric,
                       buckets=parse_buckets(args.buckets) if args.buckets else None, fmt=args.format,
                       view=args.view, out_dir=args.out, plot=args.plot, window=args.window,
                       save_scores=not args.no_save_scores, intervals=args.intervals,
                       effective_threshold=args.effective_threshold, resamples=args.resamples,
                       overwrite=args.overwrite)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------- ropescale probes report
def register_probes(subparsers) -> argparse.ArgumentParser:
    p = add_command(subparsers, "report", help="extrapolation table of probe runs (markdown/csv/json) + PNG",
                    description=probes.__doc__.split("\n\n", 1)[1])
    p.add_argument("runs", nargs="+", help="probe run directories (or folders holding them)")
    add_format(p)
    p.add_argument("--out", metavar="DIR", help="also write every table as DIR/<probe>.{md,csv,json}")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG plot here")
    add_overwrite(p, "--out / --plot")
    p.set_defaults(func=cmd_probes_report)
    return p


def cmd_probes_report(args: argparse.Namespace) -> int:
    one_file = args.out is not None and Path(args.out).suffix.lower() in TABLE_SUFFIXES
    if one_file:
        claim_output_file(args.out, overwrite=args.overwrite)
    check_report_out(None if one_file else args.out, args.plot, overwrite=args.overwrite)
    summaries = load_probe_runs(args.runs)
    text = render_probes(summaries, args.format)
    print(text, end="")
    if one_file:
        write_text_atomic(args.out, text)
    elif args.out:
        write_probe_tables(summaries, args.out)
    if args.plot:
        plot_probes(summaries, args.plot)
    return 0
