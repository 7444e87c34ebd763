"""``eval_summ generate``: greedy summaries for a CNNSum-format JSONL, the paper's way (Sec 4.2, Appendix B.1).

    python eval_summ.py generate --model PATH|tiny --data FILE.jsonl --prompt ie|ib|ft-ie|ft-ib --out DIR
                                 [--prompt-style release|paper] [--rope ntk --scale 8 ...] [--backend hf|vllm]

Input: one JSON object a line with ``context`` and ``summary`` (the reference); ``id`` is optional (default: the
line number). Prompts come from :mod:`ropescale.prompts` (baseline IE/IB in the release or paper wording, or the
fine-tuning F.2 prompts for fine-tuned models); no chat template unless ``--chat-template``.
Decoding: greedy, at least 10 new tokens, at most 400 (L, XL) / 500 (2XL, 3XL) or ``--max-new-tokens``; the
subset comes from ``--subset`` or the release file name (``cnnsum_XXL_64k.jsonl`` -> 2XL).

RoPE: a model whose config carries RoPE scaling is used as saved; ``--rope/--scale/...`` apply a method to an
unscaled model (to a scaled one only with ``--replace``).

Long inputs (``--truncate``): by default nothing is cut (``none``), as in the paper, whose point is to measure how
models behave on inputs longer than their context window: HF computes rotary positions for any length, and the
vllm backend gets ``max_model_len`` = 2x the subset's target (the paper's rule), raised to fit the longest prompt
plus generation. ``--truncate middle`` instead keeps the head and tail of the *context* (LongBench-style middle
truncation; the instructions around it are kept whole) so the prompt is at most ``--max-input-tokens`` tokens
(default: the model's extended context minus the max new tokens). run.json counts ``truncated`` samples and
``over_context`` samples (prompt + max new tokens beyond the extended context, i.e. extrapolated).

Output (a run directory, see :mod:`ropescale.runs`): ``DIR/predictions.jsonl`` — one record per sample
(id, subset, prompt, input_tokens, truncated, new_tokens, prediction, reference), appended and fsynced as each
sample finishes — and ``DIR/run.json`` (model, rope spec, train_length, prompt, prompt_style, subset, backend,
versions, counts). Re-running the same command resumes: finished ids are skipped, a killed run loses at most
the samples in flight (one per slot / batch row) and never duplicates a record; re-running with different settings into the same DIR is an
error.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from ropescale import prompts, subsets
from ropescale.io import InputError, read_jsonl
from ropescale.runs import RunDir, versions

from .backends import BACKENDS, CACHES, Item, make_backend, rope_overrides

TRUNCATE = ("none", "middle")
# settings that must match for a run directory to be resumed (anything else may differ, e.g. batch size)
RESUME_KEYS = ("model", "data", "rope", "prompt", "prompt_style", "subset", "max_new_tokens", "min_new_tokens",
               "chat_template", "truncate", "max_input_tokens")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- inputs
def load_samples(path, limit: int | None = None) -> list[dict]:
    """CNNSum JSONL rows as {id, context, reference, line}; bad rows raise InputError naming file:line."""
    rows, seen = [], {}
    for r in read_jsonl(path, required=("context", "summary")):
        line = r["_line"]
        if not isinstance(r["context"], str) or not r["context"].strip():
            raise InputError("'context' must be a non-empty string", path, line)
        if not isinstance(r["summary"], str):
            raise InputError("'summary' must be a string", path, line)
        rid = r.get("id", line)
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise InputError(f"'id' must be a string or an integer, got {rid!r}", path, line)
        if rid in seen:
            raise InputError(f"duplicate id {rid!r} (first on line {seen[rid]})", path, line)
        seen[rid] = line
        rows.append({"id": rid, "context": r["context"], "reference": r["summary"], "line": line})
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise InputError("no samples", path)
    return rows


def resolve_subset(name: str | None, data_path) -> subsets.Subset | None:
    """--subset (L, XL, 2XL, 3XL, or T<tokens> for a scaled-down subset), else the release file name, else None."""
    if name:
        m = re.fullmatch(r"[Tt](\d+)", name)
        return subsets.scaled(int(m.group(1))) if m else subsets.get(name)
    return subsets.from_filename(data_path)


def default_max_new_tokens(sub: subsets.Subset | None, data_path=None) -> int:
    """The subset's max new tokens (400 for L/XL, 500 for 2XL/3XL: paper Sec 4.2)."""
    if sub is None:
        raise InputError("cannot tell the subset from the file name (cnnsum_L_16k, cnnsum_XL_32k, "
                         "cnnsum_XXL_64k, cnnsum_XXXL_128k): pass --subset or --max-new-tokens", data_path)
    return sub.max_new_tokens


def find_train_length(model_dir: Path) -> int | None:
    """The training length of a fine-tuned model: ``train_length`` of the finetune run.json in the model dir or
    its parent (``finetune.py merge`` writes the merged model inside the run dir), else None."""
    for d in (model_dir, model_dir.parent):
        p = d / "run.json"
        if p.is_file():
            try:
                meta = json.loads(p.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if meta.get("kind", "finetune") == "finetune" and meta.get("train_length") is not None:
                return int(meta["train_length"])
    return None


def prepare_config(model_dir: Path, spec):
    """(config, effective RopeSpec, hf_overrides): the saved config with ``spec`` applied if one is asked for."""
    from transformers import AutoConfig

    from rope_scaling import apply_rope, read_rope

    config = AutoConfig.from_pretrained(str(model_dir))
    saved = read_rope(config)
    if spec is None or spec.method == "none":
        return config, saved, {}
    if saved.method != "none" and not spec.replace:
        raise InputError(f"the model's config already carries RoPE scaling ({saved.describe()}); it is used as "
                         f"saved: drop the --rope flags, or add --replace to override it", model_dir / "config.json")
    before = config.to_dict()
    apply_rope(config, spec)
    return config, read_rope(config), rope_overrides(before, config.to_dict())


class Tokenize:
    """Prompt rendering + tokenization (+ optional chat template and middle truncation) for one model."""

    def __init__(self, tokenizer, prompt: str, style: str, chat_template: bool):
        self.tok = tokenizer
        self.prompt = prompt
        self.style = style
        self.chat = chat_template
        prompts.template(prompt, style)  # validates prompt/style
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise InputError("--chat-template: the tokenizer has no chat template")

    def ids(self, context: str) -> list[int]:
        text = prompts.render(context, self.prompt, self.style)
        if self.chat:
            text = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)
            return self.tok(text, add_special_tokens=False)["input_ids"]
        return self.tok(text)["input_ids"]

    def middle_truncated(self, context: str, limit: int) -> tuple[list[int], bool]:
        """The prompt's ids with the context's middle cut so that at most ``limit`` tokens remain."""
        ids = self.ids(context)
        if len(ids) <= limit:
            return ids, False
        ctx = self.tok(context, add_special_tokens=False)["input_ids"]
        keep = len(ctx) - (len(ids) - limit)
        while True:
            if keep <= 0:
                raise InputError(f"--max-input-tokens {limit} leaves no room for the context (the prompt alone "
                                 f"is {len(self.ids(''))} tokens)")
            head = keep // 2
            text = self.tok.decode(ctx[:head]) + self.tok.decode(ctx[len(ctx) - (keep - head):])
            ids = self.ids(text)
            if len(ids) <= limit:
                return ids, True
            keep -= len(ids) - limit  # re-tokenization at the cut can add a token or two


# ---------------------------------------------------------------- the command
def generate(model="tiny", data=None, prompt="ie", out=None, *, prompt_style="release", subset=None, rope=None,
             max_new_tokens=None, min_new_tokens=subsets.MIN_NEW_TOKENS, backend="hf", chat_template=False,
             truncate="none", max_input_tokens=None, device="auto", dtype="auto", batch_tokens=None, max_batch=64,
             cache="slots", compile=False, cuda_graph=True, limit=None, progress=True, log=_log, hf_model=None) -> dict:
    """Generate predictions for ``data`` into the run directory ``out`` (see module doc); returns a summary dict.

    ``rope`` is a :class:`rope_scaling.RopeSpec` (or None = the model as saved). ``hf_model`` lets a caller pass an
    already-loaded model for the hf backend (tests, benchmarks).
    """
    from transformers import AutoTokenizer
    from tqdm import tqdm

    from rope_scaling import extended_context
    from ropescale.tiny import resolve_model

    if data is None or out is None:
        raise InputError("generate needs --data FILE.jsonl and --out DIR")
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if truncate not in TRUNCATE:
        raise InputError(f"unknown --truncate {truncate!r} (choose from {', '.join(TRUNCATE)})")
    prompt = prompt.lower()
    prompts.template(prompt, prompt_style)
    data = Path(data)
    sub = resolve_subset(subset, data)
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(sub, data)
    if max_new_tokens < 1 or min_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 1 and --min-new-tokens >= 0 "
                         f"(got {max_new_tokens}, {min_new_tokens})")
    samples = load_samples(data, limit)
    model_dir = resolve_model(model)
    config, eff_rope, overrides = prepare_config(model_dir, rope)
    ext_ctx = int(extended_context(config))
    if truncate == "middle":
        max_input_tokens = max_input_tokens or ext_ctx - max_new_tokens
        if max_input_tokens < 1:
            raise InputError(f"the extended context ({ext_ctx}) leaves no room for the input after "
                             f"{max_new_tokens} new tokens; pass --max-input-tokens")
    elif max_input_tokens is not None:
        raise InputError("--max-input-tokens needs --truncate middle")

    run = RunDir(out)
    settings = {
        "model": str(model) if str(model) in ("tiny", "") else str(Path(model).resolve()),
        "data": str(data.resolve()), "rope": eff_rope.to_dict(), "prompt": prompt,
        "prompt_style": prompt_style if prompt in ("ie", "ib") else None,
        "subset": sub.name if sub else None, "max_new_tokens": int(max_new_tokens),
        "min_new_tokens": int(min_new_tokens), "chat_template": bool(chat_template), "truncate": truncate,
        "max_input_tokens": max_input_tokens,
    }
    if run.exists():
        old = run.read_meta()
        diff = [k for k in RESUME_KEYS if k in old and old.get(k) != settings[k]]
        if diff:
            k = diff[0]
            raise InputError(f"holds a run with different settings ({k}: {old.get(k)!r} there, {settings[k]!r} "
                             f"now); use another --out or remove it", run.meta_path)
    predictions = run.log("predictions.jsonl")
    todo = [s for s in samples if s["id"] not in predictions]
    log(f"[generate] {data.name}: {len(samples)} samples, {len(samples) - len(todo)} already done, "
        f"{len(todo)} to go; prompt {prompt}{'' if settings['prompt_style'] is None else '/' + prompt_style}, "
        f"subset {settings['subset']}, max new tokens {max_new_tokens}, rope {eff_rope.describe()}, "
        f"extended context {ext_ctx}")

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tk = Tokenize(tokenizer, prompt, prompt_style, chat_template)
    items = []
    for s in todo:
        if truncate == "middle":
            ids, cut = tk.middle_truncated(s["context"], max_input_tokens)
        else:
            ids, cut = tk.ids(s["context"]), False
        items.append(Item(s["id"], ids, {"reference": s["reference"], "truncated": cut}))

    meta = {"kind": "generate", **settings, "model_dir": str(model_dir), "train_length": find_train_length(model_dir),
            "extended_context": ext_ctx, "backend": backend, "n_samples": len(samples), "status": "running",
            "versions": versions()}
    be = None
    if items:  # the backend first: a backend that cannot start (no vllm, no GPU) leaves no run directory behind
        longest = max(len(it.input_ids) for it in items)
        max_model_len = max(2 * sub.target if sub else 0, longest + max_new_tokens)
        be = make_backend(backend, model_dir, config, tokenizer, device=device, dtype=dtype,
                          batch_tokens=batch_tokens, max_batch=max_batch, cache=cache, compile=compile,
                          cuda_graph=cuda_graph,
                          model=hf_model, rope_overrides=overrides, max_model_len=max_model_len, log=log)
        meta.update(backend_info=be.describe())
    if run.exists():  # resuming: keep what the earlier run recorded (created...)
        meta = {**run.read_meta(), **meta}
    run.write_meta(meta)

    t0 = time.time()
    if be is not None:
        bar = tqdm(total=len(items), desc=f"generate {prompt}", unit="sample", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        new_tok = [0]

        def on_done(it: Item, out_ids: list[int]) -> None:
            predictions.append({
                "id": it.id, "subset": settings["subset"], "prompt": prompt, "input_tokens": len(it.input_ids),
                "truncated": it.extra["truncated"], "new_tokens": len(out_ids),
                "prediction": tokenizer.decode(out_ids, skip_special_tokens=True),
                "reference": it.extra["reference"]})
            new_tok[0] += len(out_ids)
            bar.update(1)
            bar.set_postfix(tok_s=f"{new_tok[0] / max(time.time() - t0, 1e-9):.1f}")

        be.generate(items, int(max_new_tokens), int(min_new_tokens), on_done)
        bar.close()
    seconds = time.time() - t0
    recs = predictions.records()
    ids = {s["id"] for s in samples}
    done = [r for r in recs if r["id"] in ids]
    counts = {
        "done": len(done), "truncated": sum(bool(r.get("truncated")) for r in done),
        "over_context": sum(r["input_tokens"] + max_new_tokens > ext_ctx for r in done),
        "hit_max_new_tokens": sum(r.get("new_tokens", 0) >= max_new_tokens for r in done),
    }
    meta.update(status="complete" if len(done) == len(samples) else "partial", counts=counts,
                last_seconds=round(seconds, 2),
                last_samples_per_hour=round(len(items) * 3600 / seconds, 1) if items and seconds > 0 else None)
    run.write_meta(meta)
    log(f"[generate] wrote {len(done)} predictions to {run.path / 'predictions.jsonl'} "
        f"({len(items)} new in {seconds:.1f}s; {counts['truncated']} truncated, {counts['over_context']} beyond "
        f"the extended context)")
    return {"out": str(run.path), "samples": len(samples), "generated": len(items), "seconds": round(seconds, 2),
            **counts}


# ---------------------------------------------------------------- CLI
def add_generate_args(p: argparse.ArgumentParser) -> None:
    """The generation flags (shared with ``eval_summ run``)."""
    from rope_scaling import add_rope_args

    p.add_argument("--model", default="tiny", help="HF model directory, or 'tiny' (the embedded default)")
    p.add_argument("--data", required=True, help="CNNSum-format JSONL: context, summary[, id]")
    p.add_argument("--prompt", required=True, choices=prompts.PROMPT_TYPES,
                   help="ie / ib: baseline prompts (Appendix F.1); ft-ie / ft-ib: fine-tuning prompts (F.2), "
                        "for models fine-tuned with them")
    p.add_argument("--prompt-style", default="release", choices=prompts.STYLES,
                   help="wording of ie/ib: the official release's strings (default) or the paper's Appendix F.1")
    p.add_argument("--out", required=True, help="run directory (resumed if it exists with the same settings)")
    p.add_argument("--subset", help="L, XL, 2XL, 3XL (or T<tokens> for a scaled-down subset); default: from the "
                                    "release file name")
    p.add_argument("--max-new-tokens", type=int, help="default: 400 for L/XL, 500 for 2XL/3XL (paper Sec 4.2)")
    p.add_argument("--min-new-tokens", type=int, default=subsets.MIN_NEW_TOKENS, help="default: %(default)s")
    p.add_argument("--backend", default="hf", choices=BACKENDS, help="hf (CPU/GPU) or vllm (GPU; lazy import)")
    p.add_argument("--chat-template", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--truncate", default="none", choices=TRUNCATE,
                   help="none (default, the paper's extrapolation setting) or middle (cut the context's middle "
                        "to --max-input-tokens)")
    p.add_argument("--max-input-tokens", type=int,
                   help="with --truncate middle; default: the extended context minus the max new tokens")
    p.add_argument("--device", default="auto", help="hf backend: auto, cpu, cuda[:N]")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    p.add_argument("--batch-tokens", type=int,
                   help="hf backend: token budget of a batch, i.e. slots x (longest prompt + 2 x max new tokens) "
                        "with --cache slots (default: 32K on CPU with slots, else 8K; from free memory on GPU)")
    p.add_argument("--max-batch", type=int, default=64, help="hf backend: most samples per batch")
    p.add_argument("--cache", default="slots", choices=CACHES,
                   help="hf backend decoder: slots (default: ropescale's slot decoder: per-sample prefill, "
                        "continuous batching, a CUDA-graph decode step on GPU; needs transformers 5.x + SDPA, else "
                        "falls back to static), or transformers generate on length-sorted padded batches with a "
                        "static (written in place) or dynamic (concatenated every step) KV cache")
    p.add_argument("--compile", action="store_true",
                   help="hf backend, --cache static: let transformers compile the decode step (CUDA)")
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                   help="hf backend, --cache slots: run decode steps eagerly on CUDA (for debugging)")
    p.add_argument("--limit", type=int, help="only the first N samples")
    add_rope_args(p)


def generate_kwargs(args) -> dict:
    from rope_scaling import spec_from_args

    spec = spec_from_args(args)
    return dict(model=args.model, data=args.data, prompt=args.prompt, out=args.out, prompt_style=args.prompt_style,
                subset=args.subset, rope=spec, max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.min_new_tokens, backend=args.backend, chat_template=args.chat_template,
                truncate=args.truncate, max_input_tokens=args.max_input_tokens, device=args.device,
                dtype=args.dtype, batch_tokens=args.batch_tokens, max_batch=args.max_batch, cache=args.cache,
                compile=args.compile, cuda_graph=args.cuda_graph, limit=args.limit)


def _main(args) -> int:
    res = generate(**generate_kwargs(args))
    print(json.dumps(res, ensure_ascii=False))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate", help="greedy summaries for a CNNSum-format JSONL (hf or vllm backend), resumable",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(p)
    p.set_defaults(func=_main)
