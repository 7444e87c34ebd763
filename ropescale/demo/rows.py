"""One row of the demo's tables: its angle bound (with Liu et al.'s closed form where its case holds), its
fine-tune's answer losses, its cells by the report's own formulas (with the marks-only floor), and the JSON record
that holds them all (:func:`table_row`)."""
from __future__ import annotations

import math
from pathlib import Path

from rope_scaling.formulas import REGISTRY

from .steps import Demo, Row

LEARNED = 1.0  # answer loss (nats/token) over the last steps above which a row is marked "answer loss > 1 nat"
LAST = 4  # steps the final loss is averaged over


def train_losses(train_dir: Path) -> tuple[float, float, int] | None:
    """(answer loss at step 1, mean over the last LAST steps, steps) from a fine-tune's train_log.jsonl."""
    p = Path(train_dir) / "train_log.jsonl"
    if not p.is_file():
        return None
    from ropescale.common.io import read_jsonl

    steps = {r["step"]: r["loss"] for r in read_jsonl(p) if isinstance(r.get("loss"), (int, float))}
    if not steps:
        return None
    order = sorted(steps)
    last = [steps[s] for s in order[-LAST:]]
    return steps[order[0]], sum(last) / len(last), order[-1]


def row_bound(model: str, spec=None, train_record: dict | None = None) -> dict:
    """A row's angle bound, called what it is: a necessary condition, not a prediction. ``bound``: the pre-training
    bound (``formulas.reach``) of a training-free row, ``formulas.finetune_bound`` with the fine-tune's longest trained
    distance (``ropescale.common.runs.identity.trained_distance``) for a fine-tuned one; ``pretrain``: the pre-training
    bound alone; ``liu``: Liu et al. 2023's closed form (``formulas.critical_period``: the critical pair's full period
    under the new base, T_train = the original context) where its premise holds -- a training-free row whose method
    is plain RoPE at one base (``Method.one_base``: none, ntk, abf); else None. Values in tokens, None for unbounded."""
    from rope_scaling import bounds as F
    from rope_scaling.load import load_config
    from ropescale.common.runs.identity import trained_distance

    mc = load_config(model, spec)
    st = mc.state
    orig, new = st.original_frequencies(), st.frequencies(mc.context)
    tl = trained_distance(train_record)
    pre = F.reach(st.orig_ctx, orig.inv_freq, new.inv_freq)
    bound = pre if tl is None else F.finetune_bound(st.orig_ctx, orig.inv_freq, new.inv_freq, tl)
    liu = None
    if tl is None and REGISTRY[st.spec.method].one_base:
        liu = F.critical_period(st.rotary_dim, st.base, new.base, st.orig_ctx)

    def fin(v):
        return None if v is None or math.isinf(v) else v

    return {"bound": fin(bound), "pretrain": fin(pre), "liu": fin(liu), "trained_length": tl,
            "rule": "reach" if tl is None else "finetune_bound"}


def row_stats(run_dirs: list[Path], threshold: float | None = None):
    """One row's cells by the report's own formulas (a report over the row's runs only): the extrapolation row
    (estimates with n and interval, effective length with ``threshold``), IE - IB per column (paired interval), the
    MSE with its noise floor, the recall view's marks-only floor per column (an Estimate each) and each column's
    per-sample scores ({column: (IE {sample key: score}, IB {...})}). None without runs."""
    from ropescale.evaluation.report.intake import build_report

    rep = build_report([str(d) for d in run_dirs if (d / "predictions.jsonl").is_file()])
    cols, rows = rep.extrapolation(threshold)
    if not rows:
        return None
    s = rows[0]["setting"]
    return {"columns": cols, "row": rows[0], "diffs": {c: rep.difference(s, c) for c in cols}, "mse": rep.mse(s),
            "floor": {c: rep.floor(c) for c in cols}, "floor_samples": floor_samples(rep),
            "samples": {c: tuple(rep.samples.get((s, k, c), {}) for k in ("IE", "IB")) for c in cols}}


def floor_samples(rep) -> dict:
    """{column: {sample id: the marks-only floor's ROUGE-L of that sample}} (the runs' ``marks_only_rouge_l``)."""
    out: dict = {}
    for r in rep.runs:
        for smp in r.samples:
            sub = smp.get("subset") or r.summary.get("subset")
            if isinstance(smp.get("marks_only_rouge_l"), (int, float)):
                out.setdefault(sub, {})[str(smp.get("id"))] = float(smp["marks_only_rouge_l"])
    return out


def floor_threshold(floor: dict) -> float | None:
    """The above-floor length's threshold: the highest upper 95 % bound of the marks-only floor over the lengths (a
    row at or above it scores more than the marks, the task's free points, at every length it holds). A fixed
    threshold as in RULER's rule, but not RULER's effective length, whose threshold is a strong model's score."""
    his = [e.hi for e in floor.values() if e is not None and e.hi is not None]
    return max(his) if his else None


def first_cell(st, cols):
    return None if not st or not cols else st["row"]["cells"].get(cols[0])


def rounded_ci(e) -> list | None:
    return None if e is None or e.lo is None else [round(e.lo, 4), round(e.hi, 4)]


def table_row(d: Demo, r: Row, st: dict | None, cols: list[str], base_1x: float | None,
              bound: dict | None = None) -> dict:
    """One row of the demo table as its JSON record: the bound (``bound``: another record's, for the F.1 row of
    the same model), training length, answer losses, cells with n (eval samples) and intervals, effective length,
    retention, IE - IB per column with its paired sign-flip p, the MSE with its floor, permutation p and P(MSE >= 5)
    under no prompt effect, and every sample's score per column and prompt (``samples``: {column: {"IE": {id:
    score}, "IB": ...}})."""
    from rope_scaling import RopeSpec
    from ropescale.common.runs.identity import TrainLength
    from ropescale.common.runs.record import read_train_record
    from ropescale.common.stats.lengths import retention
    from ropescale.common.stats.tests import mse_sign_flip, paired_sign_flip

    record = read_train_record(r.model) if r.train_dir is not None else None
    if bound is None:
        b = row_bound(str(d.model_dir), RopeSpec(r.method, scale=d.scale) if r.flags else None) \
            if r.train_dir is None else row_bound(r.model, None, record or {})
    else:
        b = {k: bound.get(k) for k in ("bound", "pretrain", "liu", "trained_length", "rule")}
    loss = train_losses(r.train_dir) if r.train_dir is not None else None
    tl = TrainLength.of((record or {}).get("length")) if r.train_dir is not None else None
    row = st["row"] if st else {"cells": {}, "estimates": {}, "effective": {}, "retention": None}
    est = row["estimates"]
    diffs = (st or {}).get("diffs", {})
    mse = (st or {}).get("mse")
    samples = {c: v for c, v in (st or {}).get("samples", {}).items() if v[0] or v[1]}
    flips = {c: paired_sign_flip(ie, ib) for c, (ie, ib) in samples.items() if ie and ib}
    mse_test = mse_sign_flip(samples) if samples else None
    return {"row": r.label, "key": r.key, "method": r.method, "fine_tuned": r.train_dir is not None, **b,
            "train_length": tl and tl.to_dict(), "train_length_text": tl and tl.text(),
            "loss_step1": loss and loss[0], "loss_last": loss and loss[1], "steps": loss and loss[2],
            "loss_above": loss is not None and loss[1] > LEARNED,
            "cells": {c: row["cells"].get(c) for c in cols},
            "n": {c: e.n for c, e in est.items() if e.mean is not None},
            "ci": {c: rounded_ci(e) for c, e in est.items() if e.mean is not None},
            "effective_length": {k: v and v.to_dict() for k, v in row["effective"].items()},
            "retention": retention(first_cell(st, cols), base_1x),
            "ie_minus_ib": {c: x and {"mean": x.mean, "ci": rounded_ci(x), "n_pairs": x.n_pairs,
                                      "p": flips[c].p if c in flips else None} for c, x in diffs.items()},
            "mse_ie_ib": mse and mse.mse, "mse_floor": mse and mse.floor, "mse_ci": rounded_ci(mse),
            "mse_p": mse_test and mse_test.p, "mse_p_red": mse_test and mse_test.extra.get("p_red"),
            "samples": {c: {k: {str(key[-1]): v for key, v in g.items()} for k, g in zip(("IE", "IB"), pair) if g}
                        for c, pair in samples.items()},
            "prompts": "F.2"}
