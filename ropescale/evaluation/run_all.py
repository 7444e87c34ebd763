"""``eval_summ run``: generate + score + report in one command -- one data file, or the paper's whole matrix.

    python eval_summ.py run --model PATH|tiny --data-dir DIR [--prompts ie,ib] --out OUT [generate flags]
    python eval_summ.py run --model PATH|tiny --data FILE.jsonl --prompt ie --out OUT [generate flags]
                            [--metric cnnsum|standard] [--with RUN_DIR ...]

Both write the report -- Table 2, the Table 7 view, the extrapolation table and the failure modes -- to
``OUT/report/`` (``.md``, ``.csv``, ``.json``) and Fig. 3 to ``OUT/fig3.png``, and print the tables (``--json``: a
summary instead).

``--data-dir DIR`` (the paper's evaluation of one model): DIR holds the CNNSum release files
(``cnnsum_L_16k.jsonl``, ``cnnsum_XL_32k.jsonl``, ``cnnsum_XXL_64k.jsonl``, ``cnnsum_XXXL_128k.jsonl``; 2XL / 3XL
spellings and names without the ``_16k``-style suffix are accepted, Parquet too). A subset with no file is
reported and skipped; no file at all is an error. Every subset x prompt (``--prompts``, default ``ie,ib``) is
generated into ``OUT/<subset>_<prompt>/`` (resumable: re-running continues where a killed run stopped; the model is
loaded once for the hf backend) and scored. Each file's subset is its records' ``subset`` field, else its name.

``--data FILE`` (one run): ``generate`` into OUT (resumable), ``score`` it (OUT/scores.json and
OUT/sample_scores.jsonl), then report it together with any ``--with`` run directories (or folders of them).
"""
from __future__ import annotations

import dataclasses
import sys

from ropescale.common import prompts as _prompts
from ropescale.common.cli import add_command, add_json, add_overwrite, add_resume, doc_sections, print_result
from ropescale.common.io import InputError, check_output_dir, claim_output_dir
from ropescale.common.settings import add_settings, from_args

from .data import find_release_files, load_samples
from .generate import GenerateSettings, generate, resolve_subset

DEFAULT_PROMPTS = ("ie", "ib")


def _log_default(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def run(settings: GenerateSettings, *, metric: str = "cnnsum", with_runs=(), plot=None, report_out=None,
        buckets=None, log=None, resume: str = "auto", overwrite: bool = False) -> dict:
    """Generate (``settings``), score, and build the report (into ``report_out``, default OUT/report/, and Fig. 3
    into ``plot``, default OUT/fig3.png). Returns {"generate": ..., "score": scores.json summary, "report": the
    tables as markdown, "report_dir", "plot"}."""
    from .report.cli import check_report_out, make_report
    from .score import score_run

    log = log or _log_default
    out = check_output_dir(settings.out) if settings.out is not None else None
    report_out = report_out or (out / "report" if out is not None else None)
    plot = plot or (out / "fig3.png" if out is not None else None)
    check_report_out(report_out, plot, overwrite=overwrite)
    gen = generate(settings, log=log, resume=resume)
    log(f"[run] scoring {gen['out']} ({metric} ROUGE-L)")
    summary = score_run(gen["out"], metric)
    log(f"[run] ROUGE-L {summary['rouge_l']:.2f} over {summary['n']} samples")
    text = make_report([gen["out"], *with_runs], metric=metric, buckets=buckets, out_dir=report_out, plot=plot,
                       overwrite=overwrite)
    return {"generate": gen, "score": summary, "report": text, "report_dir": str(report_out), "plot": str(plot)}


def parse_prompts(spec) -> list[str]:
    """'ie,ib' (or a list) -> ['ie', 'ib']: known prompt types, no duplicates."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).replace(" ", "").split(",")
    out = []
    for p in items:
        p = str(p).strip().lower()
        if not p:
            continue
        if p not in _prompts.PROMPT_TYPES:
            raise InputError(f"--prompts: unknown prompt {p!r} (choose from {', '.join(_prompts.PROMPT_TYPES)})")
        if p in out:
            raise InputError(f"--prompts: {p!r} given twice")
        out.append(p)
    if not out:
        raise InputError("--prompts: no prompt given (e.g. ie,ib)")
    return out


def run_matrix(settings: GenerateSettings, *, data_dir, prompts=DEFAULT_PROMPTS, metric: str = "cnnsum",
               with_runs=(), buckets=None, log=None, resume: str = "auto", overwrite: bool = False) -> dict:
    """The paper's evaluation of one model: every release file of ``data_dir`` x every prompt into
    ``OUT/<subset>_<prompt>/`` (OUT = ``settings.out``), scored, then the report in ``OUT/report/`` and Fig. 3 in
    ``OUT/fig3.png`` (see the module doc). ``settings`` without data / prompt / subset (each cell sets them).
    Returns {"runs": {name: {"generate", "score"}}, "skipped": [subsets], "report": markdown, "report_dir",
    "plot"}."""
    from ropescale.common.runs.resume import check_resume_mode, claim_run_dir

    from .report.cli import check_report_out, make_report
    from .score import score_run

    log = log or _log_default
    prompts = parse_prompts(prompts)
    for k in ("data", "prompt", "subset"):
        if getattr(settings, k) is not None:
            raise InputError(f"--{k} does not go with --data-dir (each file's subset is its records' 'subset' "
                             f"field or its name; prompts come from --prompts)")
    if settings.data_files or settings.data_split:
        raise InputError("--data-files / --data-split do not go with --data-dir")
    if settings.out is None:
        raise InputError("run --data-dir needs --out DIR")
    out = claim_output_dir(settings.out, "--out", whole=False, overwrite=overwrite)
    report_dir, plot = out / "report", out / "fig3.png"
    check_report_out(report_dir, plot, overwrite=overwrite)
    files, missing = find_release_files(data_dir)
    for path in files.values():  # every file read (and its records' subset checked) before the first run
        samples = load_samples(path, settings.limit)
        resolve_subset(None, path.name, samples, str(path))
    for name in files:  # --resume never: no cell may hold a run yet (checked before the first one generates)
        for prompt in prompts:
            check_resume_mode(claim_run_dir(out / f"{name}_{prompt}", "generate"), resume)
    for name in missing:
        log(f"[run] {data_dir}: no file for subset {name}, skipped")
    log(f"[run] {len(files)} subset(s) x {len(prompts)} prompt(s): "
        + ", ".join(f"{n} ({p.name})" for n, p in files.items()))
    backends: dict = {}  # one loaded model for every cell (hf backend), one vLLM engine per max_model_len
    results, dirs = {}, []
    try:
        for name, path in files.items():
            for prompt in prompts:
                cell = f"{name}_{prompt}"
                d = out / cell
                log(f"[run] {cell}: {path.name} -> {d}")
                cell_settings = dataclasses.replace(settings, data=str(path), prompt=prompt, out=str(d))
                gen = generate(cell_settings, log=log, backends=backends, resume=resume)
                summary = score_run(d, metric)
                log(f"[run] {cell}: ROUGE-L {summary['rouge_l']:.2f} over {summary['n']} samples")
                results[cell] = {"generate": gen, "score": summary}
                dirs.append(str(d))
    finally:
        backends.clear()
    text = make_report([*dirs, *with_runs], metric=metric, buckets=buckets, out_dir=report_dir, plot=plot,
                       overwrite=overwrite)
    return {"runs": results, "skipped": missing, "report": text, "report_dir": str(report_dir), "plot": str(plot)}


def cmd_run(args) -> int:
    from .report.model import parse_buckets

    buckets = parse_buckets(args.buckets) if args.buckets else None
    settings = from_args(args, GenerateSettings)
    if args.data_dir is not None:
        if settings.data is not None:
            raise InputError("give --data FILE or --data-dir DIR, not both")
        if args.plot or args.report_out:
            raise InputError("with --data-dir the report goes to OUT/report/ and Fig. 3 to OUT/fig3.png "
                             "(--plot / --report-out are for --data)")
        if settings.prompt is not None and args.prompts is not None:
            raise InputError("give --prompts (or one --prompt), not both")
        prompts = args.prompts if args.prompts is not None else (settings.prompt or ",".join(DEFAULT_PROMPTS))
        res = run_matrix(dataclasses.replace(settings, prompt=None), data_dir=args.data_dir, prompts=prompts,
                         metric=args.metric, with_runs=args.with_runs, buckets=buckets, resume=args.resume,
                         overwrite=args.overwrite)
        return print_result({k: res[k] for k in ("runs", "skipped", "report_dir", "plot")}, args.json, res["report"])
    if settings.data is None:
        raise InputError("run needs --data FILE (one run) or --data-dir DIR (the whole matrix)")
    if settings.prompt is None:
        raise InputError("run --data needs --prompt (--prompts goes with --data-dir)")
    if args.prompts is not None:
        raise InputError("--prompts goes with --data-dir; with --data give one --prompt")
    res = run(settings, metric=args.metric, with_runs=args.with_runs, plot=args.plot, report_out=args.report_out,
              buckets=buckets, resume=args.resume, overwrite=args.overwrite)
    return print_result({k: res[k] for k in ("generate", "score", "report_dir", "plot")}, args.json, res["report"])


def register(subparsers) -> None:
    from ropescale.common.rouge import DEFAULT_METRIC, METRICS

    p = add_command(subparsers, "run", help="generate + score + report in one (resumable): one data file, or every "
                                            "subset x prompt of a release directory (--data-dir)",
                    **doc_sections(__doc__, 3, more="docs/usage.md (run)"))
    add_settings(p, GenerateSettings)
    add_resume(p, "auto")
    add_overwrite(p, "--out / --plot / --report-out")
    report = p.add_argument_group("advanced: the report")
    p.add_argument("--data-dir", metavar="DIR",
                   help="the paper's matrix: the CNNSum release files in DIR x --prompts, into OUT/<subset>_<prompt>/")
    p.add_argument("--prompts", metavar="LIST", help="with --data-dir: comma-separated prompts (default: ie,ib)")
    report.add_argument("--metric", choices=METRICS, default=DEFAULT_METRIC, help="ROUGE-L flavour (default: cnnsum)")
    report.add_argument("--with", dest="with_runs", nargs="*", default=[], metavar="RUN_DIR",
                        help="other run directories (or folders of them) to report alongside this one")
    report.add_argument("--buckets", metavar="EDGES", help="extrapolation columns by input length, e.g. 512,1024,2048")
    report.add_argument("--plot", metavar="FILE.png", help="with --data: write Fig. 3 here instead of OUT/fig3.png")
    report.add_argument("--report-out", metavar="DIR", help="with --data: write the tables here instead of OUT/report/")
    add_json(p, "a summary (runs, scores, where the report went) instead of the tables")
    p.set_defaults(func=cmd_run)
