"""Which positions a fine-tune trains, measured on the tiny default at x8 (docs/positions.md).

For each seed, the demo's data (``scripts/demo.py``: recall pairs from the training chapters packed into 1-2K-token
samples, eval sets at 512-4,096 tokens from the held-out chapters) and three fine-tunes of the ``tiny_demo`` recipe
(24 steps x 4 samples, YaRN x8 by default), each merged, generated greedily with both F.2 prompts at every length:

- ``packed`` / ``reset+document``: the demo's data, one 1-2K-token pair a sample, continuous + causal (the paper's,
  the default) / positions from 0 in each pair, each pair attending only to itself: with one pair a sample the two
  train the same thing (a check of the document path: equal up to rounding);
- (a) ``packed-short``: recall pairs of 256-512 tokens packed several a sample into 1-2K-token samples, continuous
  positions + causal attention across the pairs (CNNSum's short data concatenated);
- (b) ``reset+document-short``: the same samples, positions from 0 in each pair, each pair attending only to itself;
- (c) ``pose``: the same short pairs, one a sample, PoSE position ids (2 chunks) up to ``--pose-target`` 4,096.

Printed (and written to OUT/positions.json, OUT/positions.md): per policy, the position coverage of its run
(``run.json`` ``train.coverage``: the share of trained tokens per quarter of the 4,096-token context, the longest
position id and query-key distance) and per eval length the ROUGE-L and the exact recall of the marked sentences
(x100), each with its 95% bootstrap interval over the samples (``ropescale.evaluation.report.uncertainty``: the
mean over the two prompts of each prompt's mean, samples of every seed pooled, a sample resampled with both its
prompts).

    .venv/bin/python scripts/positions_tiny.py --seeds 0 1 2            # the issue's measurement
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
sys.path.insert(0, str(ROOT / "scripts"))

import demo  # noqa: E402  (scripts/demo.py: the demo's model, data, launch and generation steps)

# name -> (data: "long" = the demo's, one 1-2K pair a sample; "multi" = the short pairs packed into 1-2K samples;
# "short" = the short pairs, one a sample), finetune flags
POLICIES = {
    "packed": ("long", ()),
    "reset+document": ("long", ("--positions", "reset", "--attention", "document")),
    "packed-short": ("multi", ()),
    "reset+document-short": ("multi", ("--positions", "reset", "--attention", "document")),
    "pose": ("short", ("--pose-target", "{target}")),
}
QUARTERS = 4


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
        "recall", "--chapters", d.chapters, "--tokenizer", str(d.model_dir), "--heldout", str(d.heldout), "--seed",
        str(d.seed), "--part", "train", "--min-tokens", str(ctx_lo), "--max-tokens", str(ctx_hi), "--n",
            str(d.pairs), "--out", str(pairs)])
    demo.in_process("python -m data_concat", data_main, [
        "pack", "--pairs", str(pairs), "--tokenizer", str(d.model_dir), "--min-tokens", str(pack_lo or lo),
        "--max-tokens", str(pack_hi or hi), "--prompt", "mix", "--seed", str(d.seed), "--on-bad", "skip", "--out",
        str(out)])
    return out


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


def generate(d, policy: str, merged: Path) -> list[Path]:
    from ropescale.evaluation.cli import main as eval_main

    runs = []
    for pr in demo.F2:
        for tg in d.targets:
            out = d.out / f"gen_s{d.seed}" / f"{policy}_{pr}_T{tg}"
            if not (out / "predictions.jsonl").is_file():
                demo.in_process("python eval_summ.py", eval_main, [
                    "generate", "--model", str(merged), "--data", str(d.evals[tg]), "--prompt", pr,
                    "--max-new-tokens", str(d.max_new_tokens), "--out", str(out)])
            runs.append(out)
    return runs


def coverage_row(runs: list[Path]) -> dict:
    """The policy's coverage summed over its seeds' runs: token shares per quarter of the context, longest id and
    distance."""
    from ropescale.training.positions import Coverage

    covs = [Coverage.from_json(json.loads((r / "run.json").read_text(encoding="utf-8"))["train"]["coverage"])
            for r in runs]
    tot = Coverage.total(covs, covs[0].context, covs[0].bins)
    per = tot.bins // QUARTERS
    share = [sum(tot.tokens[q * per:(q + 1) * per]) / max(tot.total_tokens, 1) for q in range(QUARTERS)]
    return {"context": tot.context, "quarters": [round(100 * s, 1) for s in share], "longest": tot.longest,
            "longest_distance": tot.longest_distance, "tokens": tot.total_tokens,
            "labelled": sum(tot.labelled) + tot.labelled_beyond}


def score_cells(gen_runs: list[Path]) -> dict:
    """{length: {rouge_l, recall}: Estimate as dict} over the runs (both prompts, every seed pooled by sample)."""
    from ropescale.evaluation.report.intake import load_runs
    from ropescale.evaluation.report.uncertainty import cell_of_prompts

    by = {}  # (length, prompt) -> {(seed dir, id): (rouge_l, recall)}
    for r in load_runs(gen_runs):
        tg = int(r.path.name.rsplit("_T", 1)[1])
        seed = r.path.parent.name
        cell = by.setdefault((tg, r.kind), {})
        for s in r.samples:
            marks = s.get("marks") or []
            cell[(seed, s["id"])] = (float(s["rouge_l"]), 100.0 * sum(marks) / len(marks) if marks else 0.0)
    out = {}
    for tg in sorted({k[0] for k in by}):
        groups = [v for (t, _), v in sorted(by.items(), key=lambda kv: kv[0][1]) if t == tg]
        out[tg] = {name: est_dict(cell_of_prompts([{k: v[i] for k, v in g.items()} for g in groups]))
                   for i, name in enumerate(("rouge_l", "recall"))}
    return out


def seed_spread(gen_runs: list[Path]) -> dict:
    """{length: {rouge_l, recall}: {"seeds": {seed dir: cell mean}, "mean", "min", "max"}}: each seed's own cell
    (:func:`score_cells` over that seed's runs) and the spread of those means over the seeds."""
    by_seed: dict = {}
    for r in gen_runs:
        by_seed.setdefault(r.parent.name, []).append(r)
    per = {s: score_cells(rs) for s, rs in sorted(by_seed.items())}
    out: dict = {}
    for tg in sorted({t for v in per.values() for t in v}):
        for key in ("rouge_l", "recall"):
            vals = {s: v[tg][key]["mean"] for s, v in per.items() if tg in v and v[tg][key]["mean"] is not None}
            if vals:
                out.setdefault(tg, {})[key] = {"seeds": vals, "mean": round(sum(vals.values()) / len(vals), 2),
                                               "min": min(vals.values()), "max": max(vals.values())}
    return out


def spread_table(results: dict) -> str:
    """Each policy's per-seed cell means as ``mean (min-max)`` over the seeds."""
    lengths = sorted({tg for r in results.values() for tg in r["seeds"]})
    n = max(len(c["seeds"]) for r in results.values() for t in r["seeds"].values() for c in t.values())
    lines = [f"Spread over the {n} seeds: each seed's cell mean (its own 16 samples x 2 prompts), mean (min-max)", "",
             "| policy | " + " | ".join(f"T{tg} ROUGE-L" for tg in lengths) + " | "
             + " | ".join(f"T{tg} recall" for tg in lengths) + " |", "|---" * (1 + 2 * len(lengths)) + "|"]
    for name, r in results.items():
        cells = []
        for key in ("rouge_l", "recall"):
            for tg in lengths:
                c = r["seeds"].get(tg, {}).get(key)
                cells.append("-" if c is None else f"{c['mean']:.1f} ({c['min']:.1f}-{c['max']:.1f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def est_dict(e) -> dict:
    def r(x):
        return None if x is None else round(x, 2)

    return {"mean": r(e.mean), "lo": r(e.lo), "hi": r(e.hi), "n": e.n}


def table(results: dict, seeds, rope: str, scale: str) -> str:
    lengths = sorted({tg for r in results.values() for tg in r["scores"]})
    lines = [f"Tiny default, {rope} x{scale}, tiny_demo recipe (24 steps x 4 samples), seeds "
             f"{', '.join(map(str, seeds))}; ROUGE-L / exact recall x100, mean of ft-ie and ft-ib [95% bootstrap "
             f"interval]", "",
             "| policy | coverage: tokens per quarter of the context (%) | longest id | longest distance | "
             + " | ".join(f"T{tg} ROUGE-L" for tg in lengths) + " | " + " | ".join(f"T{tg} recall" for tg in lengths)
             + " |", "|---" * (4 + 2 * len(lengths)) + "|"]
    for name, r in results.items():
        c = r["coverage"]
        cells = [f"{s['mean']:.1f} [{s['lo']:.1f}, {s['hi']:.1f}]" if s["lo"] is not None else f"{s['mean']:.1f}"
                 for key in ("rouge_l", "recall") for s in (r["scores"][tg][key] for tg in lengths)]
        lines.append(f"| {name} | {' / '.join(f'{q:.1f}' for q in c['quarters'])} | {c['longest']} | "
                     f"{c['longest_distance']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        d = demo.Demo(Path(args.out), "tiny", ("yarn",), (), args.scale, (1, 2, 4, 8), args.samples, 128, 2, 4, 256,
                      "python", (), seed, str(demo_chapters()), None, False)
        d.out.mkdir(parents=True, exist_ok=True)
        demo.the_model(d)
        demo.the_data(d)
        data = {"long": d.packed, "short": short_data(d, d.orig // 2, d.orig),
                "multi": short_data(d, d.orig // 2, d.orig, "multi", int(d.orig * d.train_lo),
                                    int(d.orig * d.train_hi))}
        for p in args.policies:
            say(f"seed {seed}: {p}")
            merged = fine_tune(d, p, data[POLICIES[p][0]], args)
            train_runs[p].append(merged.parent)
            gen_runs[p] += generate(d, p, merged)
    results = {p: {"coverage": coverage_row(train_runs[p]), "scores": score_cells(gen_runs[p]),
                   "seeds": seed_spread(gen_runs[p])} for p in args.policies}
    md = table(results, args.seeds, args.rope, f"{args.scale:g}")
    if len(args.seeds) > 1:
        md += "\n\n" + spread_table(results)
    out = Path(args.out)
    (out / "positions.json").write_text(json.dumps({"seeds": args.seeds, "rope": args.rope, "scale": args.scale,
                                                    "results": results}, indent=1), encoding="utf-8")
    (out / "positions.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    return 0


def demo_chapters():
    from ropescale.common.paths import CHAPTERS_JSONL

    return CHAPTERS_JSONL


if __name__ == "__main__":
    sys.exit(main())
