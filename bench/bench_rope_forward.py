"""Forward time of a RoPE-scaled tiny model relative to the same model unscaled (goal: ratio <= 1.02).

Both models have identical random weights (the tiny default's shape: Qwen2 arch, hidden 256, 4 layers); only the
rope entries written by ``rope_scaling.apply_rope`` differ. Forwards run at the extended context (orig * s),
interleaved A/B, B/A, ... after a warm-up; the ratio is the median over repeats of scaled / unscaled time of
back-to-back forwards. ``noise floor`` is the same measurement of the unscaled model against an identical copy.

    .venv/bin/python bench/bench_rope_forward.py                    # every method at s=8
    .venv/bin/python bench/bench_rope_forward.py --rope yarn --scale 16 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ropescale.common.process import prepare_process

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

from rope_scaling import RopeSpec, add_rope_args, apply_rope, spec_from_args  # noqa: E402
from ropescale.common.cli import cli_main  # noqa: E402

ALL = [RopeSpec("pi", 8.0), RopeSpec("ntk", 8.0), RopeSpec("dynamic_ntk", 8.0), RopeSpec("yarn", 8.0),
       RopeSpec("abf", 8.0, rope_base=500000.0)]


def build(spec: RopeSpec | None, args):
    from ropescale.tiny.build import random_model, tiny_config

    cfg = tiny_config(args.vocab, args.arch, hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
                      num_kv_heads=2, intermediate_size=args.hidden * 11 // 4, orig_ctx=args.orig_ctx)
    if spec is not None:
        apply_rope(cfg, spec)
    return random_model(cfg, seed=0)


def bench_pair(base_model, scaled_model, ids, repeats: int, warmup: int) -> dict:
    import torch

    def once(m) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            m(ids)
        return time.perf_counter() - t

    for _ in range(warmup):
        once(base_model), once(scaled_model)
    a, b = [], []
    for r in range(repeats):  # interleave, alternating who goes first
        if r % 2:
            b.append(once(scaled_model)), a.append(once(base_model))
        else:
            a.append(once(base_model)), b.append(once(scaled_model))
    # back-to-back pairs see the same machine load, so the median of per-pair ratios cancels drift
    ratio = statistics.median(y / x for x, y in zip(a, b))
    return {"unscaled_s": statistics.median(a), "scaled_s": statistics.median(b), "ratio": ratio}


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="bench/bench_rope_forward.py",
                                 description=__doc__.split("\n\n")[0])
    add_rope_args(ap)
    ap.add_argument("--arch", default="qwen2", choices=["qwen2", "llama", "mistral"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=6000)
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per forward (default: orig-ctx * s)")
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = least noise on shared cores)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.orig_ctx is None:
        args.orig_ctx = 64
    spec = spec_from_args(args)
    specs = [spec] if spec.scaled else ALL

    import torch

    torch.set_num_threads(args.threads)
    base_model = build(None, args)
    results = []
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, args.seq_len or args.orig_ctx * 8), generator=gen)
    noise = bench_pair(base_model, build(None, args), ids, args.repeats, args.warmup)["ratio"]
    if not args.json:
        print(f"{'noise floor (unscaled twice)':<28} seq {ids.shape[1]:>5}  ratio {noise:.3f}", flush=True)
    for sp in specs:
        seq = args.seq_len or int(args.orig_ctx * sp.scale)
        ids = torch.randint(0, args.vocab, (1, seq), generator=torch.Generator().manual_seed(0))
        r = bench_pair(base_model, build(sp, args), ids, args.repeats, args.warmup)
        results.append({"rope": sp.method, "scale": sp.scale, "seq_len": seq, **r})
        if not args.json:
            print(f"{sp.label():<28} seq {seq:>5}  unscaled {r['unscaled_s'] * 1e3:7.1f} ms  scaled "
                  f"{r['scaled_s'] * 1e3:7.1f} ms  ratio {r['ratio']:.3f}", flush=True)
    worst = max(r["ratio"] for r in results)
    if args.json:
        print(json.dumps({"results": results, "max_ratio": worst, "noise_floor": noise, "goal": 1.02,
                          "repeats": args.repeats, "threads": args.threads}, indent=1))
    else:
        print(f"max ratio {worst:.3f} (goal <= 1.02; median of {args.repeats} interleaved back-to-back pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
