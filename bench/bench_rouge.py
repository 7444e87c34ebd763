#!/usr/bin/env python
"""Speed of ropescale.common.rouge against the reference scorers, on the same real pairs, measured in one run.

1. cnnsum vs PyPI rouge 1.0.1 (what CNNSum / CLongEval run), on N real model summaries + references from
   ../shared/data/clongeval: metric only (both given the same jieba-joined strings) and end to end (jieba
   included on both sides). The two must agree to 1e-9; the goal is >= 50x on the metric.
2. standard vs rouge-score's RougeScorer(['rougeL']) with a jieba tokenizer, metric only and end to end.
3. 1,000 pairs of 500 Chinese characters (chapter excerpts of the shared novels), end to end.

rouge 1.0.1 reconstructs its LCS recursively: it runs in a thread with a 512 MB stack and a raised recursion
limit. Usage: .venv/bin/python bench/bench_rouge.py [--n 400]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

from ropescale.common.process import prepare_process

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

from ropescale.common import rouge as R  # noqa: E402
from ropescale.common.paths import CHAPTERS_JSONL, DATA_DIR  # noqa: E402
from ropescale.common.rouge_reference import run_big_stack  # noqa: E402

CPU = {}


def timed(fn):
    """(wall seconds, result); the call's process CPU seconds are kept for :func:`cpu` (shared machines)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    CPU["last"] = cpu
    return wall, out


def cpu() -> float:
    return CPU["last"]


def real_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rows = []
    for f in sorted((DATA_DIR / "clongeval").glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(seed)
    rng.shuffle(rows)
    return [(r["prediction"], r["reference"]) for r in rows[:n]]


def chapter_pairs(n: int = 1000, chars: int = 500, seed: int = 0) -> list[tuple[str, str]]:
    chapters = [json.loads(line) for line in CHAPTERS_JSONL.read_text(encoding="utf-8").splitlines()]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choice(chapters)["text"]
        a, b = rng.randrange(len(t) - chars), rng.randrange(len(t) - chars)
        out.append((t[a:a + chars], t[b:b + chars]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400, help="real pairs to time (default 400 of 1,690)")
    args = ap.parse_args()

    from rouge import Rouge
    from rouge_score import rouge_scorer

    pairs = real_pairs(args.n)
    R.load_jieba()
    t_jieba, toks = timed(lambda: [(R.tokenize(p), R.tokenize(r)) for p, r in pairs])
    c_jieba = cpu()
    joined = [(" ".join(a), " ".join(b)) for a, b in toks]
    print(f"{len(pairs)} real CLongEval pairs; mean {sum(len(a) for a, _ in toks) / len(toks):.0f} / "
          f"{sum(len(b) for _, b in toks) / len(toks):.0f} jieba tokens (prediction / reference); "
          f"jieba: {t_jieba:.2f} s")

    # --- 1. cnnsum vs rouge 1.0.1
    def pkg_scores():
        out = []
        for (p, r), (pj, rj) in zip(pairs, joined):
            if p == "":
                out.append(0.0)
                continue
            try:
                out.append(Rouge().get_scores(pj, rj)[0]["rouge-l"]["f"])
            except ValueError:
                out.append(0.0)
        return out

    t_pkg, ref = run_big_stack(lambda: timed(pkg_scores))
    c_pkg = cpu()
    t_ours, ours = timed(lambda: [0.0 if p == "" else R.cnnsum_from_tokens(a, b) for (p, _), (a, b) in
                                  zip(pairs, toks)])
    c_ours = cpu()
    diff = max(abs(x - y) for x, y in zip(ours, ref))
    print(f"\n[cnnsum vs rouge 1.0.1]  max |diff| = {diff:.1e}  mean ROUGE-L = {100 * sum(ours) / len(ours):.4f}")
    print(f"  metric only : rouge {t_pkg:.2f} s   ours {t_ours:.3f} s   speed-up {t_pkg / t_ours:.1f}x  (goal >= 50x)")
    print(f"  end to end  : rouge {t_pkg + t_jieba:.2f} s   ours {t_ours + t_jieba:.2f} s   "
          f"speed-up {(t_pkg + t_jieba) / (t_ours + t_jieba):.1f}x  (jieba, shared by both, dominates ours)")
    print(f"  CPU seconds : rouge {c_pkg:.2f}   ours {c_ours:.3f}   jieba {c_jieba:.2f}   "
          f"metric speed-up {c_pkg / c_ours:.1f}x")

    # --- 2. standard vs rouge-score with a jieba tokenizer
    class Pre:
        def tokenize(self, text):
            return text.split(" ") if text else []

    std_toks = [([t for t in a if t.strip()], [t for t in b if t.strip()]) for a, b in toks]
    std_joined = [(" ".join(a), " ".join(b)) for a, b in std_toks]
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=Pre())
    t_rs, ref_std = timed(lambda: [scorer.score(r, p)["rougeL"].fmeasure for p, r in std_joined])
    t_std, ours_std = timed(lambda: [R.standard_from_tokens(a, b) for a, b in std_toks])
    diff = max(abs(x - y) for x, y in zip(ours_std, ref_std))
    print(f"\n[standard vs rouge-score + jieba tokenizer]  max |diff| = {diff:.1e}")
    print(f"  metric only : rouge-score {t_rs:.2f} s   ours {t_std:.3f} s   speed-up {t_rs / t_std:.1f}x")
    print(f"  end to end  : rouge-score {t_rs + t_jieba:.2f} s   ours {t_std + t_jieba:.2f} s   "
          f"speed-up {(t_rs + t_jieba) / (t_std + t_jieba):.1f}x")

    # --- 3. 1,000 pairs of 500 characters, end to end
    cp = chapter_pairs()
    t_1k, s = timed(lambda: R.rouge_l_many(cp, "cnnsum"))
    print(f"\n[1,000 pairs x 500 chars, cnnsum end to end incl. jieba]  {t_1k:.2f} s wall, {cpu():.2f} s CPU  "
          f"({1000 * t_1k / len(cp):.2f} ms/pair; mean ROUGE-L {100 * sum(s) / len(s):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
