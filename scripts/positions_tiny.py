"""Which positions a fine-tune trains, measured on the tiny default at x8, with its controls (docs/positions.md).

For each seed, the demo's data (``scripts/demo.py``: recall pairs from the training chapters packed into 1-2K-token
samples, eval sets at 512-4,096 tokens from the held-out chapters) and fine-tunes of the ``tiny_demo`` recipe (24
steps x 4 samples, YaRN x8 by default), each merged, generated greedily with both F.2 prompts at every length:

- ``training-free``: no fine-tune, YaRN x8 applied at load time (the control every policy is read against);
- ``packed`` / ``reset+document``: the demo's data, one 1-2K-token pair a sample, continuous + causal (the paper's,
  the default) / positions from 0 in each pair, each pair attending only to itself: with one pair a sample the two
  train the same thing (a check of the document path: equal up to rounding);
- (a) ``packed-short``: recall pairs of 256-512 tokens packed several a sample into 1-2K-token samples, continuous
  positions + causal attention across the pairs (CNNSum's short data concatenated);
- (a') ``packed-short-unique-marks``: (a)'s samples with each pair's marks written in its own brackets (the first
  pair of a sample keeps 【k】, the next [k], then <k>, #k#, ^k^, |k|, *k*, (k): one token each, so lengths,
  positions and labels are (a)'s): under causal attention a later pair no longer sees the earlier pairs' 【1】-【4】
  (the control for that confound of (a));
- (b) ``reset+document-short``: (a)'s samples, positions from 0 in each pair, each pair attending only to itself
  (every trained position <= 512);
- (c) ``pose``: the same short pairs, one a sample, PoSE position ids (2 chunks) up to ``--pose-target`` 4,096;
- (c') ``pose-matched``: (c) with a global batch of 16 samples instead of 4: the same 24 optimizer steps on about as
  many tokens as (b) (each run's count is printed);
- (d) ``reset+document+pose``: (b)'s samples with PoSE ids (2 chunks a pair) up to ``--pose-target``.

Printed (and written to OUT/positions.json, OUT/positions.md): per policy, the position coverage of its run
(``run.json`` ``train.coverage``: the share of trained tokens per quarter of the 4,096-token context, the longest
position id and query-key distance, the tokens trained) and per eval length the ROUGE-L and the exact recall of the
marked sentences (x100): the mean over the seeds of each seed's cell (the mean over both F.2 prompts of each
prompt's mean over the seed's samples) with its 95 % two-level bootstrap interval (seeds resampled, then each drawn
seed's samples, a sample with both its prompts; ``ropescale/common/stats/tests.py``); then the
comparisons the readings make: policy a - policy b per length on the same eval samples, the mean of the seeds'
differences with its t interval and p over the seeds (df = seeds - 1), the seeds' own differences, and the two-level
interval of the pooled difference.

    .venv/bin/python scripts/positions_tiny.py --seeds 0 1 2            # the measurement in docs/positions.md
    .venv/bin/python scripts/positions_tiny.py --seeds 0 --samples 8    # a smaller one
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ropescale import demo  # noqa: E402  (the demo's model, data, launch and generation steps: ropescale/demo/)

# name -> (data: None = no fine-tune (YaRN at load time); "long" = the demo's, one 1-2K pair a sample; "multi" = the
# short pairs packed into 1-2K samples; "multi-unique" = those samples with each pair's marks in its own brackets;
# "short" = the short pairs, one a sample), finetune flags
POLICIES = {
    "training-free": (None, ()),
    "packed": ("long", ()),
    "reset+document": ("long", ("--positions", "reset", "--attention", "document")),
    "packed-short": ("multi", ()),
    "packed-short-unique-marks": ("multi-unique", ()),
    "reset+document-short": ("multi", ("--positions", "reset", "--attention", "document")),
    "pose": ("short", ("--pose-target", "{target}")),
    "pose-matched": ("short", ("--pose-target", "{target}", "--global-batch", "16")),
    "reset+document+pose": ("multi", ("--positions", "reset", "--attention", "document", "--pose-target",
                                      "{target}")),
}
# the comparisons the readings make: (a, b)
COMPARE = (
    ("packed-short", "training-free"), ("packed", "training-free"), ("reset+document-short", "training-free"),
    ("pose", "training-free"),
    ("packed-short", "reset+document-short"), ("packed-short-unique-marks", "packed-short"),
    ("packed-short-unique-marks", "reset+document-short"), ("reset+document-short", "packed"),
    ("pose", "packed-short"), ("pose", "reset+document-short"), ("pose", "packed"),
    ("pose-matched", "pose"), ("pose-matched", "reset+document-short"),
    ("reset+document+pose", "reset+document-short"), ("reset+document+pose", "pose-matched"),
)
QUARTERS = 4
MARK = ("【", "】")
MARK_STYLES = (MARK, ("[", "]"), ("<", ">"), ("#", "#"), ("^", "^"), ("|", "|"), ("*", "*"), ("(", ")"))


def say(msg: str) -> None:
    print(f"[positions {time.time() - demo.T0:6.1f}s] {msg}", flush=True)


def short_data(d, lo: int, hi: int, name: str = "short", pack_lo: int | None = None,
               pack_hi: int | None = None) -> Path:
    """Recall pairs of ``lo``-``hi`` tokens from the training chapters (the same pairs for every ``name``), packed
    one a sample (PoSE's short samples) or, with ``pack_lo``/``pack_hi``, several a sample of that length."""
    from data_concat.cli import main as data_main
    from data_concat.packed import TRAIN_FILE
    from data_concat.tokenizer import load_tokenizer
    from ropescale.common.recall import pair_range

    out = d.out / "data" / f"packed_{name}_s{d.seed}"
    if (out / TRAIN_FILE).is_file():
        return out
    pairs = d.out / "data" / f"pairs_short_s{d.seed}.jsonl"
    ctx_lo, ctx_hi = pair_range(load_tokenizer(str(d.model_dir)), lo, hi)
    if not pairs.is_file():
        demo.in_process("python -m data_concat", data_main, [
            "recall", "--chapters", d.chapters, "--tokenizer", str(d.model_dir), "--heldout", str(d.heldout),
            "--seed", str(d.seed), "--part", "train", "--min-tokens", str(ctx_lo), "--max-tokens", str(ctx_hi),
            "--n", str(d.pairs), "--out", str(pairs)])
    demo.in_process("python -m data_concat", data_main, [
        "pack", "--pairs", str(pairs), "--tokenizer", str(d.model_dir), "--min-tokens", str(pack_lo or lo),
        "--max-tokens", str(pack_hi or hi), "--prompt", "mix", "--seed", str(d.seed), "--on-bad", "skip", "--out",
        str(out)])
    return out


def style_ids(tokenizer) -> list[tuple[int, int]]:
    """The token ids of each bracket pair of ``MARK_STYLES`` (each bracket must be one token of its own)."""
    out = []
    for o, c in MARK_STYLES:
        ids = [tokenizer(x, add_special_tokens=False)["input_ids"] for x in (o, c)]
        if any(len(i) != 1 for i in ids):
            raise SystemExit(f"[positions] the bracket {o}{c} is not one token each in this tokenizer: {ids}")
        out.append((ids[0][0], ids[1][0]))
    return out


def unique_marks(src: Path, dst: Path, tokenizer) -> dict:
    """A copy of packed set ``src`` in which pair k of every sample writes its marks (in its context and its
    answer) with the brackets ``MARK_STYLES[k]`` instead of 【】 (pair 0 keeps 【】; a style repeats only past 8
    pairs): one token for one token, so lengths, pair starts, labels and positions are ``src``'s. Returns counts:
    samples, pairs, brackets replaced, samples whose styles repeat."""
    from data_concat.packed import load_meta, load_packed, write_packed

    if (dst / "train.parquet").is_file():
        return json.loads((dst / "stats.json").read_text(encoding="utf-8")).get("unique_marks", {})
    styles = style_ids(tokenizer)
    rows = load_packed(src)
    replaced = repeats = pairs = 0
    for row in rows:
        ids, labels = row["input_ids"], row["labels"]
        starts = list(row["pair_starts"]) + [len(ids)]
        pairs += len(starts) - 1
        repeats += len(starts) - 1 > len(styles)
        for k in range(1, len(starts) - 1):
            new = styles[k % len(styles)]
            for j in range(starts[k], starts[k + 1]):
                for old, rep in zip(styles[0], new):
                    if ids[j] == old:
                        ids[j] = rep
                        replaced += 1
                        if labels[j] == old:
                            labels[j] = rep
    cols = {"input_ids": [x for r in rows for x in r["input_ids"]], "labels": [x for r in rows for x in r["labels"]],
            "pair_starts": [r["pair_starts"] for r in rows], "pair_ids": [r["pair_ids"] for r in rows],
            "length": [r["length"] for r in rows]}
    counts = {"samples": len(rows), "pairs": pairs, "brackets_replaced": replaced, "samples_with_repeats": repeats}
    stats = {**json.loads((src / "stats.json").read_text(encoding="utf-8")), "unique_marks": counts}
    write_packed(dst, cols, {**load_meta(src), "marks": "each pair of a sample in its own brackets"}, stats)
    return counts


def fine_tune(d, policy: str, data: Path, args) -> Path:
    """The policy's fine-tune (tiny_demo recipe, one process), merged; reused when merged already."""
    from ropescale.training.cli import main as finetune_main

    run = d.out / "train" / f"{policy}-{args.rope}-x{d.s_txt}-s{d.seed}"
    merged = run / "merged"
    if (merged / "config.json").is_file():
        return merged
    flags = [x.format(target=args.pose_target) for x in POLICIES[policy][1]]
    cmd = [sys.executable, "finetune.py", "--rope", args.rope, "--scale", d.s_txt, "--data", str(data), "--out",
           str(run), "--seed", str(d.seed), *flags, *(["--resume", "auto"] if run.exists() else [])]
    demo.sh(cmd)
    demo.in_process("python finetune.py", finetune_main, ["merge", "--run", str(run), "--out", str(merged)])
    return merged


def generate(d, policy: str, model: str, flags=()) -> list[Path]:
    """The policy's run dirs: ``model`` with both F.2 prompts at every length (a finished run is reused)."""
    return [demo.generate_once(d, model, flags, pr, tg, d.out / f"gen_s{d.seed}" / f"{policy}_{pr}_T{tg}")
            for pr in demo.F2 for tg in d.targets]


def coverage_row(runs: list[Path]) -> dict | None:
    """The policy's coverage summed over its seeds' runs: token shares per quarter of the context, longest id and
    distance, tokens trained (None: no fine-tune)."""
    from ropescale.training.positions import Coverage

    if not runs:
        return None
    covs = [Coverage.from_json(json.loads((r / "run.json").read_text(encoding="utf-8"))["train"]["coverage"])
            for r in runs]
    tot = Coverage.total(covs, covs[0].context, covs[0].bins)
    per = tot.bins // QUARTERS
    share = [sum(tot.tokens[q * per:(q + 1) * per]) / max(tot.total_tokens, 1) for q in range(QUARTERS)]
    return {"context": tot.context, "quarters": [round(100 * s, 1) for s in share], "longest": tot.longest,
            "longest_distance": tot.longest_distance, "tokens": tot.total_tokens,
            "labelled": sum(tot.labelled) + tot.labelled_beyond}


def collect(gen_runs: list[Path]) -> dict:
    """{(length, seed dir): [IE {id: (rouge_l, recall)}, IB {...}]} over the runs (recall: the share of the four
    marked sentences that came back exactly, x100)."""
    from ropescale.evaluation.report.intake import load_runs

    by: dict = {}
    for r in load_runs(gen_runs):
        tg = int(r.path.name.rsplit("_T", 1)[1])
        groups = by.setdefault((tg, r.path.parent.name), {})
        cell = groups.setdefault(r.kind, {})
        for s in r.samples:
            marks = s.get("marks") or []
            cell[s["id"]] = (float(s["rouge_l"]), 100.0 * sum(marks) / len(marks) if marks else 0.0)
    return {k: [v[p] for p in sorted(v)] for k, v in by.items()}


def _metric(groups: list[dict], i: int) -> list[dict]:
    return [{k: v[i] for k, v in g.items()} for g in groups]


def score_cells(collected: dict) -> dict:
    """{length: {rouge_l, recall: pooled cell as a dict}, and per-seed cell means under "seeds"}: the mean over the
    seeds of each seed's cell with the t interval over the seeds (the seed is the unit; one seed: the cell's own
    interval over its samples)."""
    from ropescale.common.stats.means import cell_of_prompts, over_seeds

    out: dict = {}
    for tg in sorted({k[0] for k in collected}):
        seeds = {s: g for (t, s), g in sorted(collected.items()) if t == tg}
        out[tg] = {"seeds": {}}
        for i, name in enumerate(("rouge_l", "recall")):
            per = {s: _metric(g, i) for s, g in seeds.items()}
            out[tg]["seeds"][name] = {s: cell_of_prompts(g).mean for s, g in per.items()}
            est = over_seeds(per) if len(per) > 1 else cell_of_prompts(next(iter(per.values())))
            out[tg][name] = est_dict(est)
    return out


def compare(a: dict, b: dict) -> dict:
    """a - b per length (the policies' collected samples, paired by seed and sample id): ROUGE-L and recall, the
    seeds' differences, their mean with the t interval and p over the seeds, and the two-level interval."""
    from ropescale.common.stats.means import cell_of_prompts, two_level_bootstrap
    from ropescale.common.stats.tests import t_over_seeds

    out: dict = {}
    for (tg, seed) in sorted(set(a) & set(b)):
        for i, name in enumerate(("rouge_l", "recall")):
            ga, gb = _metric(a[(tg, seed)], i), _metric(b[(tg, seed)], i)
            cell = out.setdefault(tg, {}).setdefault(name, {"seeds": {}, "groups": {}})
            cell["seeds"][seed] = cell_of_prompts(ga).mean - cell_of_prompts(gb).mean
            cell["groups"][seed] = ga + gb
    for tg, by in out.items():
        for name, cell in by.items():
            groups = cell.pop("groups")
            k = len(next(iter(groups.values()))) // 2
            w = [1 / k] * k + [-1 / k] * k
            t = t_over_seeds(list(cell["seeds"].values()))
            pooled = two_level_bootstrap(groups, weights=w) if len(groups) > 1 else None
            cell.update({"mean": t.statistic, "t_ci": [t.lo, t.hi], "p": t.p, "df": t.df, "reading": t.reading(),
                         "two_level_ci": None if pooled is None else [pooled.lo, pooled.hi]})
    return out


def est_dict(e) -> dict:
    def r(x):
        return None if x is None else round(x, 2)

    spread = getattr(e, "spread", None) if getattr(e, "seeds", 1) > 1 else None
    return {"mean": r(e.mean), "lo": r(e.lo), "hi": r(e.hi), "n": e.n, "seeds": getattr(e, "seeds", 1),
            "range": None if spread is None else [r(spread[0]), r(spread[1])]}


def table(results: dict, seeds, rope: str, scale: str) -> str:
    lengths = sorted({tg for r in results.values() for tg in r["scores"]})
    n = {r["scores"][tg]["rouge_l"]["n"] for r in results.values() for tg in r["scores"]}
    lines = [f"Tiny default, {rope} x{scale}, tiny_demo recipe (24 steps x 4 samples unless the policy says), seeds "
             f"{', '.join(map(str, seeds))}; ROUGE-L / exact recall x100, the mean over the seeds of each seed's cell "
             f"(ft-ie and ft-ib) [95% t interval over the seeds] (min-max of the seeds' cells); "
             f"n = {'/'.join(map(str, sorted(n)))} eval samples a cell (all seeds)", "",
             "| policy | coverage: tokens per quarter of the context (%) | longest id | longest distance | tokens "
             "trained | " + " | ".join(f"T{tg} ROUGE-L" for tg in lengths) + " | "
             + " | ".join(f"T{tg} recall" for tg in lengths) + " |", "|---" * (5 + 2 * len(lengths)) + "|"]
    for name, r in results.items():
        c = r["coverage"]
        cells = [(f"{s['mean']:.1f} [{s['lo']:.1f}, {s['hi']:.1f}]" if s["lo"] is not None else f"{s['mean']:.1f}")
                 + (f" ({s['range'][0]:.1f}-{s['range'][1]:.1f})" if s.get("range") else "")
                 for key in ("rouge_l", "recall") for s in (r["scores"][tg][key] for tg in lengths)]
        cov = ["-"] * 4 if c is None else [" / ".join(f"{q:.1f}" for q in c["quarters"]), str(c["longest"]),
                                           str(c["longest_distance"]), f"{c['tokens'] / 1000:.0f}K"]
        lines.append(f"| {name} | " + " | ".join(cov) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_table(comps: dict) -> str:
    from ropescale.common.stats.multiplicity import bh_q
    from ropescale.common.stats.tests import p_text

    lengths = sorted({tg for c in comps.values() for tg in c})
    shown = [x for c in comps.values() for tg in lengths if (x := c.get(tg, {}).get("rouge_l")) and x["p"] is not None]
    for x, q in zip(shown, bh_q([x["p"] for x in shown])):  # one declared family: the table's tests
        x["q"] = q
    lines = ["Differences, a - b on the same eval samples: ROUGE-L, mean of the seeds' differences [95% t interval "
             "over the seeds] p (t test, df = seeds - 1) q (Benjamini-Hochberg over the table's "
             f"{len(shown)} tests) (each seed's difference); below it the two-level bootstrap interval of the pooled "
             "difference (secondary: over 3 seeds it covers 78-90 %)", "",
             "| a - b | " + " | ".join(f"T{tg}" for tg in lengths) + " |", "|---" * (1 + len(lengths)) + "|"]
    for (a, b), c in comps.items():
        cells, pooled = [], []
        for tg in lengths:
            x = c.get(tg, {}).get("rouge_l")
            if x is None or x["p"] is None:
                cells.append("-" if x is None else f"{x['mean']:+.1f}")
                pooled.append("-")
                continue
            cells.append(f"{x['mean']:+.1f} [{x['t_ci'][0]:+.1f}, {x['t_ci'][1]:+.1f}] p={p_text(x['p'])} "
                         f"q={p_text(x['q'])} ("
                         + " / ".join(f"{v:+.1f}" for v in x["seeds"].values()) + ")")
            pooled.append("-" if not x["two_level_ci"] else
                          f"[{x['two_level_ci'][0]:+.1f}, {x['two_level_ci'][1]:+.1f}]")
        lines.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
        lines.append("| (two-level) | " + " | ".join(pooled) + " |")
    return "\n".join(lines)


def data_for(d, policy: str) -> Path | None:
    """The packed set a policy trains on (built on first use)."""
    kind = POLICIES[policy][0]
    if kind is None:
        return None
    if kind == "long":
        return d.packed
    if kind == "short":
        return short_data(d, d.orig // 2, d.orig)
    multi = short_data(d, d.orig // 2, d.orig, "multi", int(d.orig * d.train_lo), int(d.orig * d.train_hi))
    if kind == "multi":
        return multi
    from data_concat.tokenizer import load_tokenizer

    dst = d.out / "data" / f"packed_multi_unique_s{d.seed}"
    say(f"seed {d.seed}: unique marks per pair: {unique_marks(multi, dst, load_tokenizer(str(d.model_dir)))}")
    return dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/positions")
    ap.add_argument("--rope", default="yarn")
    ap.add_argument("--scale", type=float, default=8)
    ap.add_argument("--pose-target", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = ap.parse_args(argv)
    train_runs = {p: [] for p in args.policies}
    gen_runs = {p: [] for p in args.policies}
    for seed in args.seeds:
        d = demo.Demo(Path(args.out), "tiny", (args.rope,), (), args.scale, (1, 2, 4, 8), args.samples, 128, 2, 4,
                      256, "python", (), seed, str(demo_chapters()), None, False)
        d.out.mkdir(parents=True, exist_ok=True)
        demo.the_model(d)
        demo.the_data(d)
        for p in args.policies:
            say(f"seed {seed}: {p}")
            data = data_for(d, p)
            if data is None:
                gen_runs[p] += generate(d, p, "tiny", ("--rope", args.rope, "--scale", d.s_txt))
                continue
            merged = fine_tune(d, p, data, args)
            train_runs[p].append(merged.parent)
            gen_runs[p] += generate(d, p, str(merged))
    collected = {p: collect(gen_runs[p]) for p in args.policies}
    results = {p: {"coverage": coverage_row(train_runs[p]), "scores": score_cells(collected[p])}
               for p in args.policies}
    comps = {(a, b): compare(collected[a], collected[b]) for a, b in COMPARE if a in collected and b in collected}
    md = table(results, args.seeds, args.rope, f"{args.scale:g}")
    if comps:
        md += "\n\n" + compare_table(comps)
    out = Path(args.out)
    from ropescale.common.io import write_text_atomic

    write_text_atomic(out / "positions.json", json.dumps(
        {"seeds": args.seeds, "rope": args.rope, "scale": args.scale, "results": results,
         "comparisons": [{"a": a, "b": b, "cells": c} for (a, b), c in comps.items()]}, indent=1, default=str))
    write_text_atomic(out / "positions.md", md + "\n")
    print(md)
    return 0


def demo_chapters():
    from ropescale.common.paths import CHAPTERS_JSONL

    return CHAPTERS_JSONL


if __name__ == "__main__":
    sys.exit(main())
