"""report: the extrapolation table of probe runs.

One table per probe: rows = settings (``ropescale.common.tables.Setting``: the model and its id, the full RoPE
spec, the model's training record -- the same rows and labels as eval_summ's report --, the probe's own variant:
input length N, suffix-id variant / heading / score) x the probe's group (block size k, perturbation kind, copy /
no-copy), columns = the probe's length bucket (prefix length, input length, distance), cells = the probe's metric
(accuracy or loss, the mean over items; ``n`` items per cell in the JSON output). Two runs of the same setting are
told apart by their run directory's name. A probe with a single column bucket and several groups (the shuffle
test without ``--lengths``) shows the groups (k=1..5) as columns. Printed as markdown (default), CSV or JSON;
``--out DIR`` also writes every table as DIR/<probe>.{md,csv,json} (an ``--out`` path ending in
.md/.csv/.json/.txt, the old spelling, is written as one file in ``--format``); ``--plot FILE.png`` draws one panel
per probe with a line per row.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from rope_scaling import RopeSpec
from ropescale.common.cli import FORMAT_ALIASES, add_command, add_format
from ropescale.common.io import InputError, atomic_open, check_output_dir, check_output_file, write_text_atomic
from ropescale.common.runs import RunMeta, find_run_dirs
from ropescale.common.tables import Setting, Table, json_text, number, setting_labels, write_tables

from .common import ITEMS, SUMMARY, summarize

TABLE_SUFFIXES = (".md", ".csv", ".json", ".txt")  # --out FILE: the old spelling (one table file)


def load_runs(paths: list[str]) -> list[dict]:
    """Summaries of the probe runs under ``paths`` (recomputed from items.jsonl when summary.json is missing,
    e.g. for an interrupted run), each with the run's meta fields (probe, model, rope, metric, column) and its
    row key (``_setting``: a tables.Setting)."""
    out, owner = [], {}
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
        for k in ("probe", "model", "rope", "metric", "column"):
            s.setdefault(k, meta.get(k))
        s["run_dir"] = str(rd.path)
        s["setting"] = run_setting(meta)
        setting = Setting.of_run(meta, RopeSpec.from_record(meta.rope, meta.meta_path), variant=s["setting"])
        if owner.setdefault((s.get("probe"), setting), rd.path) != rd.path:
            setting = dataclasses.replace(setting, tag=rd.path.name)  # the same setting twice: by run directory
        s["_setting"] = setting
        out.append(s)
    if not out:
        raise InputError("no probe run directories found", ", ".join(map(str, paths)))
    return out


def run_setting(meta: RunMeta) -> str:
    """What tells apart runs of one probe beyond the model and its RoPE spec and training: the input length N of
    copy / perturb, the suffix-id variant, heading mode and score (empty for the defaults)."""
    st = meta.settings
    if meta.get("probe") in ("copy", "perturb") and meta.get("lengths"):
        return f"N={meta.get('lengths')[0]}"
    if meta.get("probe") == "suffix-id":
        parts = [p for p in (st.get("variant"), st.get("heading"), st.get("score"))
                 if p and p not in ("chapter", "index", "logprob")]
        return " ".join(parts)
    return ""


def _setting_of(summary: dict) -> Setting:
    """A summary's row key: the one load_runs recorded, else (a summary printed by a probe command) its own."""
    if "_setting" in summary:
        return summary["_setting"]
    return Setting(str(summary.get("model", "")), RopeSpec.from_record(summary.get("rope")),
                   variant=summary.get("setting", ""))


def table_rows(summaries: list[dict]) -> tuple[str, list[str], list[list], list[list]]:
    """(title, header, rows of labels + cell values, rows of cell counts) for summaries of ONE probe."""
    probe = summaries[0].get("probe", "")
    cols: list = []
    rows: dict[tuple, dict] = {}
    counts: dict[tuple, dict] = {}
    for s in summaries:
        setting = _setting_of(s)
        for c in s["cells"]:
            if c["col"] not in cols:
                cols.append(c["col"])
            key = (setting, c.get("group", ""))
            rows.setdefault(key, {})[c["col"]] = c["value"]
            counts.setdefault(key, {})[c["col"]] = c["n"]
    cols.sort(key=lambda c: (0, c) if isinstance(c, (int, float)) else (1, str(c)))
    has_group = any(k[1] for k in rows)
    if len(cols) == 1 and has_group:  # one bucket, several groups (shuffle without --lengths): groups as columns
        rows, counts, cols = _pivot(rows), _pivot(counts), sorted({k[1] for k in rows}, key=str)
        has_group = False
    labels = setting_labels(k[0] for k in rows)
    has_setting = any(lab.variant for lab in labels.values())
    has_train = any(k[0].train is not None for k in rows)
    header = (["model", "rope"] + (["train_length"] if has_train else []) + (["setting"] if has_setting else [])
              + (["group"] if has_group else []) + [str(c) for c in cols])

    def lead(k):
        lab, st = labels[k[0]], k[0]
        tl = "-" if st.train is None else (st.train_length.text() if st.train_length else "?")
        return ([lab.model, lab.rope or "none"] + ([tl] if has_train else []) + ([lab.variant] if has_setting else [])
                + ([k[1]] if has_group else []))

    ordered = sorted(rows, key=lambda k: (lead(k)[0], k[0].rope is not None and k[0].rope.method != "none",
                                          lead(k)[1:], str(k[1])))
    body = [lead(k) + [rows[k].get(c) for c in cols] for k in ordered]
    ns = [lead(k) + [counts[k].get(c) for c in cols] for k in ordered]
    metric = " / ".join(dict.fromkeys(s.get("metric", "") for s in summaries))  # e.g. logprob and pmi runs
    column = summaries[0].get("column", "")
    title = f"{probe}: {metric}; columns = {column}"
    return title, header, body, ns


def _pivot(cells: dict[tuple, dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for (setting, g), by_col in cells.items():
        out.setdefault((setting, ""), {})[g] = next(iter(by_col.values()))
    return out


_cell = number(3, "–")


def to_table(summaries: list[dict]) -> Table:
    """ONE probe's table (``tables.Table``: the one table type both reports write)."""
    title, header, body, ns = table_rows(summaries)
    probe = summaries[0].get("probe", "") or "probe"
    return Table(probe, title, ["probe"] + header, [[probe] + r for r in body], _cell, (header, body),
                 {"title": title, "header": header, "rows": body, "n": ns})


def to_markdown(title: str, header: list[str], body: list[list], ns: list[list] | None = None) -> str:
    return Table("", title, header, body, _cell).text("markdown")


def by_probe(summaries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for s in summaries:
        groups.setdefault(s.get("probe", ""), []).append(s)
    return groups


def render(summaries: list[dict], fmt: str = "markdown") -> str:
    """All tables in ``fmt`` (markdown, csv, json; ``md`` accepted)."""
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    tables = [to_table(ss) for ss in by_probe(summaries).values()]
    if fmt == "json":
        return json_text([t.json for t in tables])
    if fmt == "csv":
        return "".join(t.text("csv") for t in tables)
    if fmt != "markdown":
        raise InputError(f"unknown format {fmt!r} (markdown, csv, json)")
    return "\n".join(t.text("markdown") for t in tables)


def write_tables_to(summaries: list[dict], out_dir: str | os.PathLike):
    """Every probe's table as DIR/<probe>.{md,csv,json} (atomically); returns the paths."""
    return write_tables([to_table(ss) for ss in by_probe(summaries).values()], out_dir)


def print_summary(summary: dict, as_json: bool = False) -> None:
    """Print one run's cells to stdout (its markdown table, or JSON): what each probe command prints."""
    import json

    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    print(to_markdown(*table_rows([summary])))


def plot(summaries: list[dict], path: str | os.PathLike) -> Path:
    """One panel per probe, a line per row (setting x group, labelled as in the table) over the columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_probe(summaries)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, (probe, ss) in zip(axes[0], groups.items()):
        title, header, body, _ = table_rows(ss)
        ncol0 = 2 + sum(h in ("train_length", "setting", "group") for h in header[2:5])
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
    ap.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
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
        write_tables_to(summaries, args.out)
    if args.plot:
        plot(summaries, args.plot)
    return 0
