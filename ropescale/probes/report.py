"""report: the extrapolation table of probe runs.

One table per probe: rows = model x rope method x scale (x the probe's group: block size k, perturbation kind,
copy / no-copy), columns = the probe's length bucket (prefix length, input length, distance), cells = the probe's
metric (accuracy or loss, the mean over items; ``n`` items per cell in the JSON output). A probe with a single
column bucket and several groups (the shuffle test without ``--lengths``) shows the groups (k=1..5) as columns. Printed as markdown
(default), CSV or JSON; ``--out DIR`` also writes every table as DIR/<probe>.{md,csv,json} (an ``--out`` path
ending in .md/.csv/.json/.txt, the old spelling, is written as one file in ``--format``); ``--plot FILE.png``
draws one panel per probe with a line per row. Models are named as in eval_summ's report (ropescale.common.tables).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ropescale.common.cli import FORMAT_ALIASES, add_command, add_format
from ropescale.common.io import InputError, atomic_open, check_output_dir, check_output_file, write_text_atomic
from ropescale.common.runs import RunMeta, find_run_dirs
from ropescale.common.tables import csv_text, json_text, markdown, model_labels, number
from rope_scaling import RopeSpec

from .common import ITEMS, SUMMARY, summarize

TABLE_SUFFIXES = (".md", ".csv", ".json", ".txt")  # --out FILE: the old spelling (one table file)


def load_runs(paths: list[str]) -> list[dict]:
    """Summaries of the probe runs under ``paths`` (recomputed from items.jsonl when summary.json is missing,
    e.g. for an interrupted run), each with the run's meta fields (probe, model, rope, scale, metric, column)."""
    out = []
    for rd in find_run_dirs(paths):
        meta = RunMeta.read(rd.path)
        if meta.kind != "probe":
            continue
        if (rd.path / SUMMARY).is_file():
            s = rd.read_json(SUMMARY)
        elif (rd.path / ITEMS).is_file():
            s = summarize(rd.log(ITEMS).records())
        else:
            continue
        for k in ("probe", "model", "rope", "scale", "metric", "column"):
            s.setdefault(k, meta.get(k))
        s["run_dir"] = str(rd.path)
        s["setting"] = run_setting(meta)
        out.append(s)
    if not out:
        raise InputError("no probe run directories found", ", ".join(map(str, paths)))
    return out


def run_setting(meta: RunMeta) -> str:
    """What tells apart runs of one probe beyond model x rope x scale: the input length N of copy / perturb, the
    suffix-id variant, heading mode and score (empty for the defaults)."""
    st = meta.settings
    if meta.get("probe") in ("copy", "perturb") and meta.get("lengths"):
        return f"N={meta.get('lengths')[0]}"
    if meta.get("probe") == "suffix-id":
        parts = [p for p in (st.get("variant"), st.get("heading"), st.get("score"))
                 if p and p not in ("chapter", "index", "logprob")]
        return " ".join(parts)
    return ""


def table_rows(summaries: list[dict]) -> tuple[str, list[str], list[list], list[list]]:
    """(title, header, rows of labels + cell values, rows of cell counts) for summaries of ONE probe."""
    probe = summaries[0].get("probe", "")
    cols: list = []
    rows: dict[tuple, dict] = {}
    counts: dict[tuple, dict] = {}
    owner: dict[tuple, str] = {}
    has_setting = any(s.get("setting") for s in summaries)
    labels = model_labels(str(s.get("model", "")) for s in summaries)
    for s in summaries:
        model = labels[str(s.get("model", ""))]
        base = (model, RopeSpec.from_record(s.get("rope")).method, float(s.get("scale") or 1.0), s.get("setting", ""))
        if owner.setdefault(base, s.get("run_dir", "")) != s.get("run_dir", ""):
            # two runs with the same row labels: tell them apart by their run directory's name
            model = f"{model} ({Path(s.get('run_dir', '')).name})"
            base = (model,) + base[1:]
        for c in s["cells"]:
            if c["col"] not in cols:
                cols.append(c["col"])
            key = base[:3] + (c.get("group", ""),) + base[3:]
            rows.setdefault(key, {})[c["col"]] = c["value"]
            counts.setdefault(key, {})[c["col"]] = c["n"]
    cols.sort(key=lambda c: (0, c) if isinstance(c, (int, float)) else (1, str(c)))
    has_group = any(k[3] for k in rows)
    if len(cols) == 1 and has_group:  # one bucket, several groups (shuffle without --lengths): groups as columns
        rows, counts, cols = _pivot(rows), _pivot(counts), sorted({k[3] for k in rows}, key=str)
        has_group = False
    header = (["model", "rope", "scale"] + (["setting"] if has_setting else []) + (["group"] if has_group else [])
              + [str(c) for c in cols])
    ordered = sorted(rows, key=lambda k: (k[0], k[1] != "none", k[1], k[2], str(k[4]), str(k[3])))
    body, ns = [], []
    for k in ordered:
        lab = [k[0], k[1], f"{k[2]:g}"] + ([k[4]] if has_setting else []) + ([k[3]] if has_group else [])
        body.append(lab + [rows[k].get(c) for c in cols])
        ns.append(lab + [counts[k].get(c) for c in cols])
    metric = " / ".join(dict.fromkeys(s.get("metric", "") for s in summaries))  # e.g. logprob and pmi runs
    column = summaries[0].get("column", "")
    title = f"{probe}: {metric}; columns = {column}"
    return title, header, body, ns


def _pivot(cells: dict[tuple, dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for (m, r, sc, g, st), by_col in cells.items():
        out.setdefault((m, r, sc, "", st), {})[g] = next(iter(by_col.values()))
    return out


_cell = number(3, "–")


def to_markdown(title: str, header: list[str], body: list[list], ns: list[list] | None = None) -> str:
    return f"**{title}**\n\n{markdown(header, body, _cell)}\n"


def by_probe(summaries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for s in summaries:
        groups.setdefault(s.get("probe", ""), []).append(s)
    return groups


def render(summaries: list[dict], fmt: str = "markdown") -> str:
    """All tables in ``fmt`` (markdown, csv, json; ``md`` accepted)."""
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    tables = [table_rows(ss) for ss in by_probe(summaries).values()]
    if fmt == "json":
        return json_text([{"title": t, "header": h, "rows": b, "n": n} for t, h, b, n in tables])
    if fmt == "csv":
        return "".join(csv_text(["probe"] + h, ([t.split(":")[0]] + r for r in b)) for t, h, b, _ in tables)
    if fmt != "markdown":
        raise InputError(f"unknown format {fmt!r} (markdown, csv, json)")
    return "\n".join(to_markdown(*t) for t in tables)


def write_tables(summaries: list[dict], out_dir: str | os.PathLike) -> list[Path]:
    """Every probe's table as DIR/<probe>.{md,csv,json} (atomically); returns the paths."""
    written = []
    for probe, ss in by_probe(summaries).items():
        for ext, fmt in (("md", "markdown"), ("csv", "csv"), ("json", "json")):
            p = Path(out_dir) / f"{probe or 'probe'}.{ext}"
            write_text_atomic(p, render(ss, fmt))
            written.append(p)
    return written


def print_summary(summary: dict, as_json: bool = False) -> None:
    """Print one run's cells to stdout (its markdown table, or JSON): what each probe command prints."""
    import json

    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    print(to_markdown(*table_rows([summary])))


def plot(summaries: list[dict], path: str | os.PathLike) -> Path:
    """One panel per probe, a line per row (model x rope x scale x group) over the columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_probe(summaries)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, (probe, ss) in zip(axes[0], groups.items()):
        title, header, body, _ = table_rows(ss)
        ncol0 = 3 + sum(h in ("setting", "group") for h in header[3:5])
        cols = header[ncol0:]
        numeric = all(c.lstrip("-").isdigit() for c in cols)
        xs = [int(c) for c in cols] if numeric else list(range(len(cols)))
        for r in body:
            pts = [(x, v) for x, v in zip(xs, r[ncol0:]) if v is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=" ".join(map(str, r[:ncol0])))
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        if not numeric:
            ax.set_xticks(xs, cols)
        ax.set_title(title.split(";")[0])
        ax.set_xlabel(ss[0].get("column", ""))
        ax.set_ylabel(ss[0].get("metric", ""))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    try:
        with atomic_open(path, "wb") as f:  # a temp file beside PATH, renamed into place (mode as open() gives)
            fig.savefig(f, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def register(sub) -> None:
    ap = add_command(sub, "report", help="extrapolation table of probe runs (markdown/csv/json) + PNG",
                     description=__doc__)
    ap.add_argument("runs", nargs="+", help="probe run directories (or folders holding them)")
    add_format(ap)
    ap.add_argument("--out", metavar="DIR", help="also write every table as DIR/<probe>.{md,csv,json}")
    ap.add_argument("--plot", metavar="FILE.png", help="write a PNG plot here")
    ap.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    one_file = args.out is not None and Path(args.out).suffix.lower() in TABLE_SUFFIXES
    if args.out:
        (check_output_file if one_file else check_output_dir)(args.out)
    if args.plot:
        check_output_file(args.plot)
    summaries = load_runs(args.runs)
    text = render(summaries, args.format)
    print(text, end="")
    if one_file:
        write_text_atomic(args.out, text)
    elif args.out:
        write_tables(summaries, args.out)
    if args.plot:
        plot(summaries, args.plot)
    return 0
