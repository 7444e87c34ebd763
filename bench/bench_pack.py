"""Benchmark: pack 9,000 synthetic 2K-4K-token pairs into 16K (or 32K) samples (CNNSum Sec 5 sizes).

Token ids are synthesized directly (the packer is what is measured, not a tokenizer). Prints pairs/s of
data_concat (plan + build + write Parquet) and the share of real (non-padding) tokens, against a baseline
measured in the same run: the usual fixed-length packing, where pairs are appended in order to a 16,384-token
block (32,768 for --target 32k) and the block is padded when the next pair does not fit.

    .venv/bin/python bench/bench_pack.py [--pairs 9000] [--seed 0] [--target 16k|32k] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ropescale.common.process import prepare_process

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

from data_concat.pack import TARGETS, EncodedPair, pack_encoded  # noqa: E402
from data_concat.packed import compute_stats, write_packed  # noqa: E402

K = 1024


def synth_pairs(n: int, seed: int) -> list[EncodedPair]:
    """``n`` pairs of 2K-4K tokens: a prompt part and a 100-500-token summary + EOS."""
    rng = np.random.default_rng(seed)
    total = rng.integers(2 * K, 4 * K + 1, size=n)
    summ = rng.integers(100, 501, size=n)
    out = []
    for i in range(n):
        p = rng.integers(0, 150_000, size=int(total[i] - summ[i]), dtype=np.int32)
        s = rng.integers(0, 150_000, size=int(summ[i]), dtype=np.int32)
        s[-1] = 151643
        out.append(EncodedPair(f"s{i}", p, s, "ft-ib", f"synthetic:{i + 1}"))
    return out


def baseline_fixed_blocks(lengths, block: int) -> tuple[int, int]:
    """Sequential fill of fixed ``block``-token blocks, padded; returns (blocks, real tokens)."""
    blocks, cur, real = 0, 0, 0
    for n in lengths:
        if n > block:
            continue
        if cur + n > block:
            blocks += 1
            cur = 0
        cur += n
        real += n
    return blocks + (1 if cur else 0), real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=9000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", choices=tuple(TARGETS), default="16k")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    lo, hi = TARGETS[args.target]
    block = {"16k": 16 * K, "32k": 32 * K}[args.target]
    pairs = synth_pairs(args.pairs, args.seed)
    lengths = [len(p) for p in pairs]
    in_tokens = sum(lengths)

    t0 = time.perf_counter()
    blocks, real = baseline_fixed_blocks(lengths, block)
    t_base = time.perf_counter() - t0
    base_share = real / (blocks * block)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cols, plan = pack_encoded(pairs, lo, hi, args.seed)
        t_plan = time.perf_counter() - t0
        sup = []
        a = 0
        for n in cols["length"]:
            sup.append(int((cols["labels"][a:a + int(n)] != -100).sum()))
            a += int(n)
        stats = compute_stats(cols["length"].tolist(), sup, [len(s) for s in plan.samples], lo, hi)
        write_packed(Path(tmp) / "out", cols, {"min": lo, "max": hi}, stats)
        t_all = time.perf_counter() - t0
    stored = int(cols["length"].sum())
    # real tokens = tokens of the pairs placed in samples, over every position stored (samples carry no padding)
    real_ours = sum(lengths[i] for s in plan.samples for i in s) / stored
    used_share = stored / in_tokens
    res = {
        "pairs": args.pairs, "input_tokens": in_tokens, "samples": stats["samples"],
        "length_min_mean_max": [stats["length"]["min"], stats["length"]["mean"], stats["length"]["max"]],
        "pairs_per_sample_mean": stats["pairs_per_sample"]["mean"], "leftover_pairs": len(plan.leftover),
        "pairs_per_s_plan": round(args.pairs / t_plan), "pairs_per_s_total": round(args.pairs / t_all),
        "real_share": real_ours, "input_token_share_used": round(used_share, 5),
        "real_share_if_padded_to_max": stats["real_share_if_padded_to_max"],
        "baseline_fixed_block_real_share": round(base_share, 5), "baseline_pairs_per_s": round(args.pairs / t_base),
        "real_share_ratio_vs_baseline": round(real_ours / base_share, 4),
    }
    if args.json:
        print(json.dumps(res))
    else:
        report = [
            f"packed {args.pairs} synthetic 2K-4K pairs ({in_tokens} tokens) into {res['samples']} samples of "
            f"[{lo}, {hi}] tokens (mean {stats['length']['mean']}, {res['pairs_per_sample_mean']} pairs each)",
            f"data_concat: {res['pairs_per_s_total']} pairs/s incl. Parquet write ({res['pairs_per_s_plan']} "
            f"pairs/s plan + build); real tokens {100 * real_ours:.2f}% (unpadded); input tokens used "
            f"{100 * used_share:.2f}% ({len(plan.leftover)} leftover pairs); "
            f"{100 * res['real_share_if_padded_to_max']:.2f}% if a trainer pads every sample to {hi}",
            f"baseline fixed {block}-token blocks, padded: real tokens {100 * base_share:.2f}% "
            f"({blocks} blocks; {res['baseline_pairs_per_s']} pairs/s, planning only)",
            f"ratio real-token share data_concat / baseline: {res['real_share_ratio_vs_baseline']:.3f}   "
            f"goal >= 98%: {'met' if real_ours >= 0.98 and used_share >= 0.98 else 'NOT met'}",
        ]
        print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
