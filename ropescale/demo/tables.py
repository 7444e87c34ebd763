"""Step 6 of the demo: its own tables (report/demo.{md,csv,json}; demo.json also records the demo's settings). A: per
row the bound, ROUGE-L per length with n and intervals beside the marks-only floor, effective and above-floor length,
retention; B: IE - IB and MSE(P-IE vs P-IB) with their tests; C: the differences the readings compare, each with its
interval and paired sign-flip p."""
from __future__ import annotations

from .rows import LAST, LEARNED, first_cell, floor_threshold, rounded_ci, row_stats, table_row
from .steps import F1, F2, Demo, say, tagged

COMPARED = ("yarn", "ntk")  # the two fine-tuned methods the readings compare (when both are fine-tuned): a - b


def demo_table(d: Demo) -> list[dict]:
    """Step 6: the demo's own tables (report/demo.{md,csv,json}), printed with both Table 2 views; returns its
    rows. Table A: per row the bound, ROUGE-L per length with n and 95 % intervals, the effective context length
    (NoLiMa's 85 % of 1x), the above-floor length (the marks-only floor's highest upper bound as threshold) and
    retention; table B: IE - IB per length with its paired interval and sign-flip p, MSE(P-IE vs P-IB) beside its
    noise floor with its permutation p; table C: the differences the readings compare, with intervals and p."""
    from ropescale.common.io import write_text_atomic
    from ropescale.common.settings import to_record
    from ropescale.common.tables import csv_text, json_text

    say("step 6/6: the demo tables: A. the angle bound (fine-tune aware) beside Liu et al.'s closed form, ROUGE-L per "
        "length with n and 95% intervals beside the marks-only floor, effective and above-floor length, retention; "
        "B. IE-IB with paired intervals and permutation p, MSE(P-IE vs P-IB) beside its noise floor with its p; "
        "C. the differences the readings compare")
    cols = [f"T{tg}" for tg in d.targets]
    base_runs = [d.gen / f"{d.rows[0].key}_{pr}_T{tg}" for pr in F2 for tg in d.targets]
    first = row_stats(base_runs)
    floor = first["floor"] if first else {}
    thr = floor_threshold(floor)
    stats = {r.key: row_stats([d.gen / f"{r.key}_{pr}_T{tg}" for pr in F2 for tg in d.targets], thr) for r in d.rows}
    base_1x = first_cell(stats[d.rows[0].key], cols)
    records = [{"row": "marks only (the floor)", "cells": {c: e and e.mean for c, e in floor.items()},
                "n": {c: e.n for c, e in floor.items() if e}, "ci": {c: rounded_ci(e) for c, e in floor.items()},
                "threshold": thr,
                "samples": {c: {"floor": v} for c, v in (first["floor_samples"] if first else {}).items()}}]
    for r in d.rows:
        records.append(table_row(d, r, stats[r.key], cols, base_1x))
        if r is d.rows[0] and d.baseline_prompts:  # the same model with the F.1 baseline prompts
            st = row_stats([d.gen_f1 / f"base_{pr}_T{tg}" for pr in F1 for tg in d.f1_targets], thr)
            rec = table_row(d, r, st, cols, None, bound=records[-1])  # retention: F.2 and F.1 not compared
            # evaluated inside the window only: no effective length to measure
            records.append({**rec, "row": f"{r.label}, F.1 baseline prompts (1x only)", "key": "base-f1",
                            "prompts": "F.1", "effective_length": {}})
    comps = comparisons(d, records, cols)
    add_q(records)
    md_a, md_b, header, table = demo_markdown(records, cols, thr)
    md_c = comparisons_markdown(comps, cols)
    write_text_atomic(d.report / "demo.md", f"{md_a}\n\n{md_b}\n\n{md_c}\n")
    write_text_atomic(d.report / "demo.csv", csv_text(header, table))
    write_text_atomic(d.report / "demo.json", json_text({"columns": cols, "threshold": thr, "rows": records,
                                                         "comparisons": comps, "settings": to_record(d)}))
    for md in (md_a, md_b, md_c):
        print()
        print(md)
    for p, what in ((d.report / "table2.md", "F.2 prompts"),
                    (d.report / "baseline_prompts" / "table2.md", "F.1 baseline prompts")):
        if p.is_file():
            print()
            print(f"({what})")
            print(p.read_text(encoding="utf-8").strip())
    return records


def sample_means(rec: dict, col: str) -> dict:
    """{sample id: the mean of its scores under the prompts present} of one row's column (the demo record's
    ``samples``): the unit a comparison of two rows pairs."""
    by = (rec.get("samples") or {}).get(col) or {}
    ids = sorted({i for scores in by.values() for i in scores}, key=_sort_id)
    return {i: sum(v[i] for v in by.values() if i in v) / sum(1 for v in by.values() if i in v) for i in ids}


def _sort_id(i: str):
    return (0, int(i), "") if i.isdigit() else (1, 0, i)


def comparison_pairs(d: Demo) -> list[tuple[str, str, str]]:
    """(label, row key a, row key b) of the differences the readings compare: every row against the marks-only
    floor (on the same samples); each method at load time against the base model; each fine-tune against its
    method at load time; fine-tuned YaRN against fine-tuned NTK; the base model's F.1 prompts against its F.2
    prompts (at 1x)."""
    s = d.s_txt
    pairs = [(f"{r.label} - floor", r.key, "floor") for r in d.rows]
    pairs += [(f"{m} x{s} at load time - base", f"free-{m}-x{s}", "base") for m in d.free]
    pairs += [(f"fine-tuned {m} x{s} - {m} x{s} at load time", f"ft-{m}-x{s}", f"free-{m}-x{s}")
              for m in d.methods if m in d.free]
    a, b = COMPARED
    if a in d.methods and b in d.methods:
        pairs.append((f"fine-tuned {a} x{s} - fine-tuned {b} x{s}", tagged("ft", a, s), tagged("ft", b, s)))
    if d.baseline_prompts:
        pairs.append(("base, F.1 - F.2 prompts", "base-f1", "base"))
    return pairs


def comparisons(d: Demo, records: list[dict], cols: list[str]) -> list[dict]:
    """Table C's records: per compared pair of rows and column, a - b over the eval samples both scored (each
    sample's prompts averaged), with its interval, two-sided paired sign-flip permutation p (unit: the eval sample)
    and its Benjamini-Hochberg q over the table's tests (one declared family)."""
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import paired_sign_flip

    by = {rec.get("key", "floor"): rec for rec in records}
    tests = {}
    for label, a, b in comparison_pairs(d):
        if a not in by or b not in by:
            continue
        tests[(label, a, b)] = {}
        for c in cols:
            x, y = sample_means(by[a], c), sample_means(by[b], c)
            if x and y:
                tests[(label, a, b, c)] = paired_sign_flip(x, y)
    fam = family({k: t for k, t in tests.items() if len(k) == 4})
    out = []
    for key in (k for k in tests if len(k) == 3):
        cells = {k[3]: t for k, t in fam.items() if k[:3] == key}
        out.append({"label": key[0], "a": key[1], "b": key[2], "cells": {
            c: {"mean": t.statistic, "ci": [t.lo, t.hi] if t.lo is not None else None, "p": t.p, "q": t.q,
                "family": t.family, "n": t.n, "unit": t.unit, "min_p": t.min_p, "exact": t.exact,
                "reading": t.reading()} for c, t in cells.items()}})
    return out


def add_q(records: list[dict]) -> None:
    """Table B's two declared families, each with its Benjamini-Hochberg q beside p: every row's IE - IB cells
    (``ie_minus_ib[col]['q']``) and the rows' MSE permutation tests (``mse_q``)."""
    from ropescale.common.stats.multiplicity import bh_q

    cells = [x for rec in records if "key" in rec for x in rec["ie_minus_ib"].values() if x and x.get("p") is not None]
    for x, q in zip(cells, bh_q([x["p"] for x in cells])):
        x["q"] = q
    rows = [rec for rec in records if rec.get("mse_p") is not None]
    for rec, q in zip(rows, bh_q([rec["mse_p"] for rec in rows])):
        rec["mse_q"] = q


def comparisons_markdown(comps: list[dict], cols: list[str]) -> str:
    title = ("### C. Differences the readings compare: a - b on the same eval samples (each sample's two prompts "
             "averaged) [95% t interval] p (paired sign-flip permutation, two-sided) q (Benjamini-Hochberg "
             "over the table)")
    from ropescale.common.tables import markdown

    rows = [[c["label"], *[diff_text(c["cells"].get(col)) for col in cols]] for c in comps]
    tests = sum(len(c["cells"]) for c in comps)
    ns = sorted({x["n"] for c in comps for x in c["cells"].values()})
    note = (f"n = {'/'.join(map(str, ns)) or '-'} eval samples a cell (the unit); p exact over the 2^n sign vectors "
            f"(up to n = 16, smallest p 2/2^n; else 20,000 random ones); q: Benjamini-Hochberg over the table's "
            f"{tests} tests (one family); a difference is resolved where q < 0.05 ({tests} tests at p < 0.05 "
            f"would resolve about {0.05 * tests:.1f} by chance when nothing differs).")
    return f"{title}\n{markdown(['difference', *cols], rows)}\n\n{note}"


def _tok(v) -> str:
    return "unbounded" if v is None else f"{v:,.0f}"


def demo_markdown(records: list[dict], cols: list[str], thr: float | None) -> tuple[str, str, list, list]:
    """The two markdown tables (with their titles) and the CSV's header and rows, from the JSON records."""
    from ropescale.common.tables import markdown

    thr_txt = "-" if thr is None else f"{thr:.1f}"
    head_a = ["row", "bound (tokens)", "Liu et al. 2023 T_extra", "train length (the data set): mean (range)",
              "answer loss: step 1 -> last", "n (samples)", *cols, "effective length (85% of 1x)",
              f"above-floor length (>= {thr_txt})", "retention"]
    rows_a, rows_b, csv_rows = [], [], []
    for rec in records:
        fine = "key" in rec
        eff = rec.get("effective_length") or {}
        ns = sorted(set((rec.get("n") or {}).values()))
        n_txt = "-" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
        loss = None if rec.get("loss_last") is None else \
            f"{rec['loss_step1']:.2f} -> {rec['loss_last']:.2f} ({rec['steps']} steps)"
        label = rec["row"] + (f" (answer loss > {LEARNED:g} nat)" if rec.get("loss_above") else "")
        rows_a.append([label, _tok(rec["bound"]) if fine else "", "" if not fine or rec.get("liu") is None
                       else _tok(rec["liu"]), rec.get("train_length_text") or "", loss or "", n_txt,
                       *[cell_text(rec, c) for c in cols],
                       *[(eff.get(k) or {}).get("text", "-") if fine and eff else "" for k in ("relative", "absolute")],
                       "" if rec.get("retention") is None else f"{100 * rec['retention']:.0f}%"])
        if fine:
            diffs = rec["ie_minus_ib"]
            red = rec.get("mse_p_red")
            rows_b.append([rec["row"], *[diff_text(diffs.get(c)) for c in cols], mse_text(rec),
                           "-" if red is None else f"{red:.2f}"])
        csv_rows.append([rec["row"], rec.get("bound"), rec.get("liu"), *[rec["cells"].get(c) for c in cols],
                         *[x for c in cols for x in (rec.get("ci", {}).get(c) or [None, None])],
                         (eff.get("relative") or {}).get("length"), (eff.get("absolute") or {}).get("length"),
                         rec.get("retention"), rec.get("mse_ie_ib"), rec.get("mse_floor"), rec.get("mse_p"),
                         rec.get("mse_p_red")])
    title_a = ("### A. ROUGE-L x100 by total eval length (prompt + context + answer budget <= T), mean of the two "
               "prompts (F.2 unless the row says F.1) [95% t interval]; n eval samples per cell, each under "
               "both prompts")
    note_a = (f"Bound: the longest context in which every rotary pair stays inside the angles it saw (pre-training; "
              f"for a fine-tuned row also its fine-tune's longest sample) -- a necessary condition, not a prediction. "
              f"Liu et al. 2023 T_extra: their closed form (the critical pair's full period under the new base), "
              f"which they derive for a model fine-tuned with the new base at its original training length; shown "
              f"for the base-change rows, none of which had that fine-tune. Effective length: the longest length up "
              f"to which the row keeps >= 85% of its own 1x score (NoLiMa's rule); '-': no 85% length for a row "
              f"below {thr_txt} at 1x. Above-floor length: the longest length up to which the row scores >= "
              f"{thr_txt}, the marks-only floor's highest upper 95% bound (a fixed threshold, as in RULER's rule; "
              f"not RULER's effective length, whose threshold is a strong model's score). '>T': holds at every "
              f"length. Retention: the row's 1x score / the base model's. Answer loss: nats per answer token at "
              f"step 1 and over the last {LAST} steps.")
    reds = [r.get("mse_p_red") for r in records if "key" in r and r.get("mse_p_red") is not None]
    title_b = ("### B. IE - IB per length [paired 95% t interval] p (paired sign-flip permutation, "
               "two-sided) q (Benjamini-Hochberg over the table's IE - IB cells), and MSE(P-IE vs P-IB) [noise floor] "
               "p (permutation) q (BH over the rows' MSE tests) with P(MSE >= 5) under no prompt effect")
    note_b = ("Noise floor: the MSE expected with no prompt effect (its mean under that null, not a test). MSE p: "
              "each sample's IE and IB scores swapped at random in every cell (20,000 draws), p = P(null MSE >= "
              "MSE). P(MSE >= 5): how often a row with no prompt effect reaches the paper's red mark (Table 2: MSE "
              "5.0 or more) at this n" + (f"; summed over these {len(reds)} rows: {sum(reds):.1f} red rows expected "
                                          f"from noise alone." if reds else "."))
    md_a = f"{title_a}\n{markdown(head_a, rows_a)}\n\n{note_a}"
    md_b = (f"{title_b}\n{markdown(['row', *cols, 'MSE [floor] p', 'P(MSE >= 5) under no effect'], rows_b)}\n\n"
            f"{note_b}")
    header = ["row", "bound", "liu_t_extra", *cols, *[f"{c}_{x}" for c in cols for x in ("lo", "hi")],
              "effective_length_85", "above_floor_length", "retention", "mse", "mse_floor", "mse_p", "mse_p_red5"]
    return md_a, md_b, header, csv_rows


def cell_text(rec: dict, c: str) -> str:
    """A row record's cell in column ``c``: the mean [its interval], x100, one decimal; "-" where it is empty."""
    m, ci = rec["cells"].get(c), rec.get("ci", {}).get(c)
    return "-" if m is None else f"{m:.1f}" if not ci else f"{m:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def diff_text(x: dict | None) -> str:
    if not x or x.get("mean") is None:
        return "-"
    p = "" if x.get("p") is None else f" p={p_text(x['p'])}" + ("" if x.get("q") is None else f" q={p_text(x['q'])}")
    if not x.get("ci"):
        return f"{x['mean']:+.1f}{p}"
    lo, hi = x["ci"]
    return f"{x['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]{p}"


def mse_text(rec: dict) -> str:
    m, f, p = rec.get("mse_ie_ib"), rec.get("mse_floor"), rec.get("mse_p")
    return "-" if m is None else (f"{m:.1f}" + ("" if f is None else f" [{f:.1f}]")
                                  + ("" if p is None else f" p={p_text(p)}")
                                  + ("" if rec.get("mse_q") is None else f" q={p_text(rec['mse_q'])}"))


def p_text(p):
    from ropescale.common.stats.tests import p_text as text

    return text(p)
