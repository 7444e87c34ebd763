#!/usr/bin/env python
"""Generation throughput: the hf backend of ``eval_summ generate`` vs plain ``model.generate`` (greedy, batch 1),
on the same prompts and the same loaded model, measured in one run; prints samples/hour of both and the ratio,
and checks that both produced the same tokens on the samples both ran.

    .venv/bin/python bench/bench_generate.py                      # CPU, the tiny default model (goal >= 2x)
    python bench/bench_generate.py --device cuda --shape 7b       # H100: 7B-shaped Qwen1.5-like model, random
                                                                  # weights, bf16, SDPA, 16K prompts (goal >= 5x)
    python bench/bench_generate.py --device cpu --toy             # the CUDA path's code on a toy shape, seconds
                                                                  # (GQA as 7b-gqa; --shape toy-mha: MHA as 7b)

Prompts: token ids drawn from the shared novels (tiny model) or random ids (random-weight shapes), lengths spread
over a CNNSum-like range (L: 12K-18K tokens for 7b; 1.5K-2.3K, i.e. L scaled to the tiny model's 512-token
context x4, for tiny). Both sides decode exactly ``--new-tokens`` tokens (default 400, what eval_summ generates for
L and for the tiny model's scaled subsets; min = max new tokens, so an early EOS cannot make one side's work
smaller). The baseline runs ``--base-samples`` of the prompts (it is the slow side),
ours runs all ``--samples``; samples/hour is each side's count / its own time. The two sides run interleaved
(one baseline prompt, one of our batches / slot groups, ...), so load changes on a shared machine hit both alike.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from ropescale.common.cli import add_dtype  # noqa: E402
from ropescale.common.process import prepare_process  # noqa: E402
from ropescale.training.memory.estimate import QWEN15_7B, QWEN15_7B_ROPE  # noqa: E402

prepare_process()  # as every entry point: the CUDA allocator setting, quiet libraries

# Qwen1.5-7B's shape (ropescale.training.memory.estimate.QWEN15_7B): MHA, no GQA, so its KV cache is 0.5 MB per token in
# bf16.
SHAPES = {
    "7b": dict(**QWEN15_7B.hf_kwargs(), **QWEN15_7B_ROPE),
    # Qwen2.5-7B's shape: grouped-query attention, 4 KV heads for 28 query heads (57 KB of KV cache per token)
    "7b-gqa": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                   intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6),
    "toy": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=344, vocab_size=4096, max_position_embeddings=4096, rope_theta=1e6),
    "toy-mha": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                    intermediate_size=344, vocab_size=4096, max_position_embeddings=4096, rope_theta=1e6),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_random(shape: str, device: str, dtype):
    """A random-weight Qwen2-architecture causal LM of the given shape, created directly on ``device`` in
    ``dtype`` (no fp32 copy on the host: a 7B model is built on the GPU in seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape], tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                      eos_token_id=0, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def tiny_prompts(n: int, lo: int, hi: int, seed: int):
    """(model, tokenizer, prompts): the tiny default and ``n`` CNNSum IE prompts of novel text, ``lo``-``hi``
    tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ropescale.common import prompts
    from ropescale.common.chapters import load_chapters
    from ropescale.common.models import resolve_model

    d = resolve_model("tiny")
    tok = AutoTokenizer.from_pretrained(str(d))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype="float32", attn_implementation="sdpa").eval()
    rng = random.Random(seed)
    chapters = load_chapters()
    text = "\n".join(c["text"] for c in chapters[-40:])  # the end of 西游记
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = []
    for _ in range(n):
        k = rng.randint(lo, hi)
        s = rng.randrange(len(ids) - k)
        ctx = tok.decode(ids[s:s + k])
        p = tok(prompts.render(ctx, "ie"))["input_ids"]
        out.append(p[:hi])
    return model, tok, out


def run(args) -> dict:
    """The benchmark's phases: model and prompts -> warm-up -> both sides' streams of work -> the streams run
    interleaved -> the summary (see module doc)."""
    from ropescale.evaluation.backends.hf import pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    shape = "toy" if args.toy else args.shape
    model, tok, seqs = model_and_prompts(args, shape, device, dtype)
    warm_up(model, seqs, device)
    # Streams of work, run interleaved (always the stream with the smallest share done goes next), so a change
    # in machine load during the run hits both sides alike: the baseline = plain model.generate, greedy, batch 1,
    # one prompt a task; ours = the hf backend of eval_summ generate, one of its length-sorted batches a task.
    base_out: dict = {}
    streams = {"baseline": [_base_task(model, seqs, i, args.new_tokens, device, base_out)
                            for i in range(args.base_samples)]}
    backends, outs = ours_streams(args, model, tok, seqs, device, streams)
    secs, peaks = run_interleaved(streams, device)
    return summary(args, shape, device, dtype, seqs, base_out, outs, backends, secs, peaks)


def model_and_prompts(args, shape: str, device: str, dtype):
    """(model, tokenizer or None, prompts as token ids): the tiny default with novel prompts, or a random-weight
    shape with random ids."""
    rng = random.Random(args.seed)
    if shape == "tiny":
        model, tok, seqs = tiny_prompts(args.samples, args.min_len or 1536, args.max_len or 2304, args.seed)
        model = model.to(device=device, dtype=dtype)
    else:
        lo, hi = (args.min_len or 12 * 1024, args.max_len or 18 * 1024) if shape.startswith("7b") else \
            (args.min_len or 768, args.max_len or 1024)
        t0 = time.time()
        model = build_random(shape, device, dtype)
        log(f"[bench] built a random {shape} model on {device} in {time.time() - t0:.1f}s")
        tok = None
        vocab = model.config.vocab_size
        seqs = [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(args.samples)]
    nparams = sum(p.numel() for p in model.parameters())
    log(f"[bench] {shape}: {nparams / 1e6:.1f}M params, {device}, {str(dtype).replace('torch.', '')}, "
        f"{len(seqs)} prompts of {min(map(len, seqs))}-{max(map(len, seqs))} tokens, {args.new_tokens} new tokens "
        f"each")
    return model, tok, seqs


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warm_up(model, seqs, device: str) -> None:
    """CUDA kernels / allocator, CPU thread pools: excluded from both timings."""
    import torch

    with torch.inference_mode():
        model.generate(input_ids=torch.tensor([seqs[0][:64]], device=device), do_sample=False, max_new_tokens=4,
                       min_new_tokens=4, pad_token_id=0)
    _sync(device)


def _base_task(model, seqs, i: int, new: int, device: str, base_out: dict):
    """The baseline's task for prompt ``i``: plain batch-1 greedy generate of exactly ``new`` tokens."""
    import torch

    def run_():
        with torch.inference_mode():
            o = model.generate(input_ids=torch.tensor([seqs[i]], device=device), do_sample=False,
                               max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        base_out[i] = o[0, len(seqs[i]):].tolist()
    return run_


def ours_streams(args, model, tok, seqs, device: str, streams: dict) -> tuple[dict, dict]:
    """One stream per --cache measured (added to ``streams``): the hf backend's batches (static / dynamic) or
    slot groups (slots) as tasks. Returns (backends, outputs) by stream name."""
    from ropescale.evaluation.backends import BackendSettings, HFBackend, Item
    from ropescale.evaluation.backends.hf import plan_batches

    new = args.new_tokens
    backends: dict = {}
    outs: dict = {}
    for cache in (["slots", "static", "dynamic"] if args.cache == "all" else [args.cache]):
        key = cache + ("+compile" if args.compile and cache == "static" else "") + \
            ("-nograph" if args.no_cuda_graph and cache == "slots" else "")
        st = BackendSettings(device=device, dtype=args.dtype, batch_tokens=args.batch_tokens, max_batch=args.max_batch,
                             cache=cache, compile=args.compile, cuda_graph=not args.no_cuda_graph)
        be = HFBackend(None, model.config, tok or _NoTok(), st, model=model, log=log)
        got = outs.setdefault(key, {})

        def ours_task(batch, be=be, got=got):
            # min_new_tokens = max = new on both sides: EOS is suppressed throughout, exactly `new` tokens each
            return lambda: be.generate([Item(i, seqs[i]) for i in batch], new, new,
                                       lambda it, o: got.__setitem__(it.id, o))
        if be.cache == "slots":
            # every sample decodes exactly `new` tokens, so slots free up together: a task of `slots` samples
            # (longest first) is what continuous batching would run anyway; each task sets up its own buffers and
            # CUDA graph, so that cost is counted
            n = be.decoding().slots(new, max(map(len, seqs)))
            order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
            batches = [order[j:j + n] for j in range(0, len(order), n)]
            log(f"[bench] ours ({key}): {len(batches)} tasks of {n} slots")
        else:
            budget = be.decoding().budget(new, max(map(len, seqs)))
            batches = plan_batches([len(x) for x in seqs], new, budget, args.max_batch)
            log(f"[bench] ours ({key}): {len(batches)} batches (token budget {budget})")
        streams[key] = [ours_task(b) for b in batches]
        backends[key] = be
    return backends, outs


def run_interleaved(streams: dict, device: str) -> tuple[dict, dict]:
    """Run every stream's tasks, always the stream with the smallest share done next; (seconds, CUDA peak bytes)
    by stream."""
    import torch

    done = {k: 0 for k in streams}
    secs = {k: 0.0 for k in streams}
    peaks = {k: 0 for k in streams}
    while any(done[k] < len(v) for k, v in streams.items()):
        k = min((k for k in streams if done[k] < len(streams[k])), key=lambda k: done[k] / len(streams[k]))
        _sync(device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        streams[k][done[k]]()
        _sync(device)
        secs[k] += time.time() - t0
        if device.startswith("cuda"):
            peaks[k] = max(peaks[k], torch.cuda.max_memory_allocated())
        done[k] += 1
    return secs, peaks


def summary(args, shape, device, dtype, seqs, base_out, outs, backends, secs, peaks) -> dict:
    """The result: each side's samples/hour, whether ours produced the baseline's tokens, the ratio."""
    import torch

    new = args.new_tokens
    t_base = secs["baseline"]
    graph_used = {k: getattr(be, "graph_used", None) for k, be in backends.items()}
    log(f"[bench] plain generate (batch 1): {len(base_out)} samples in {t_base:.1f}s")
    results = {}
    for key, got in outs.items():
        same = all(got[i] == base_out[i] for i in base_out)
        log(f"[bench] ours ({key}): {len(got)} samples in {secs[key]:.1f}s; same tokens as plain generate "
            f"on the {len(base_out)} shared samples: {same}")
        # where each shared sample first departs from plain generate (bf16 with random weights: logits are
        # nearly flat, so kernel-level rounding differences flip an argmax sooner or later; fp32 must agree fully)
        agree = [next((j for j, (a, b) in enumerate(zip(got[i], base_out[i])) if a != b), len(base_out[i]))
                 for i in base_out]
        results[key] = {"seconds": round(secs[key], 2), "samples_per_hour": round(len(got) * 3600 / secs[key], 1),
                        "identical_to_baseline": same, "tokens_agreeing_before_first_difference": agree}
        if graph_used.get(key) is not None:
            results[key]["cuda_graph"] = graph_used[key]
        if peaks.get(key):
            results[key]["peak_gib"] = round(peaks[key] / 2 ** 30, 1)
    base_sph = len(base_out) * 3600 / t_base
    best = max(results.values(), key=lambda r: r["samples_per_hour"])
    return {
        "shape": shape, "device": device, "dtype": str(dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "prompt_tokens": [min(map(len, seqs)), max(map(len, seqs))], "new_tokens": new,
        "baseline": {"samples": len(base_out), "seconds": round(t_base, 2), "samples_per_hour": round(base_sph, 1),
                     "tokens_per_second": round(len(base_out) * new / t_base, 2),
                     **({"peak_gib": round(peaks["baseline"] / 2 ** 30, 1)} if peaks["baseline"] else {})},
        "ours": results, "ratio": round(best["samples_per_hour"] / base_sph, 2),
        "goal": 5.0 if shape.startswith("7b") else 2.0,
    }


class _NoTok:
    """Stand-in tokenizer for random-id prompts (the backend only needs the pad id)."""

    pad_token_id = 0
    eos_token_id = 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--shape", default=None, choices=("tiny", "7b", "7b-gqa", "toy", "toy-mha"),
                    help="tiny (the tiny default, real weights; default on CPU) or 7b (random weights; default "
                         "on CUDA)")
    ap.add_argument("--toy", action="store_true", help="the random-weight path on a toy shape (fast, any device)")
    add_dtype(ap, "fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--samples", type=int, help="prompts ours runs (default: 16 on tiny, 16 on 7b, 8 toy)")
    ap.add_argument("--base-samples", type=int, help="prompts the baseline runs (default: 4 on tiny/toy, 3 on 7b)")
    ap.add_argument("--new-tokens", type=int, help="new tokens per sample (default: 400 = what eval_summ generates "
                                                   "for L and for its scaled T<n> subsets; 32 toy)")
    ap.add_argument("--min-len", type=int)
    ap.add_argument("--max-len", type=int)
    ap.add_argument("--batch-tokens", type=int, help="ours: batch token budget (default: the backend's auto)")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--cache", default="slots", choices=("slots", "static", "dynamic", "all"),
                    help="ours: slots (default, as eval_summ generate: the slot decoder), or transformers generate "
                         "with a static / dynamic cache; all = measure each")
    ap.add_argument("--no-cuda-graph", action="store_true", help="ours (slots): decode eagerly on CUDA")
    ap.add_argument("--compile", action="store_true", help="ours: compile the static-cache decode step (CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.shape is None:
        args.shape = "7b" if args.device.startswith("cuda") and not args.toy else "tiny"
    shape = "toy" if args.toy else args.shape
    toy = shape.startswith("toy")
    args.samples = args.samples or (8 if toy else 16)
    args.base_samples = min(args.samples, args.base_samples or (4 if toy or shape == "tiny" else 3))
    args.new_tokens = args.new_tokens or (32 if toy else 400)
    res = run(args)
    if args.json:
        print(json.dumps(res))
    else:
        b = res["baseline"]
        print(f"generation, {res['shape']} on {res['gpu'] or res['device']} ({res['dtype']}), prompts "
              f"{res['prompt_tokens'][0]}-{res['prompt_tokens'][1]} tokens, {res['new_tokens']} new tokens")
        print(f"  plain HF generate, batch 1: {b['samples_per_hour']:.1f} samples/h ({b['tokens_per_second']} tok/s)")
        for cache, r in res["ours"].items():
            print(f"  eval_summ hf backend ({cache} cache): {r['samples_per_hour']:.1f} samples/h "
                  f"(x{r['samples_per_hour'] / b['samples_per_hour']:.2f}; same tokens: "
                  f"{r['identical_to_baseline']})")
        print(f"  ratio: {res['ratio']:.2f}x (goal >= {res['goal']:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
