"""``eval_summ generate``: greedy summaries for CNNSum-format data, the paper's way (Sec 4.2, Appendix B.1).

    python eval_summ.py generate --model PATH|tiny --data FILE.jsonl|DIR|NAME --prompt ie|ib|ft-ie|ft-ib --out DIR
                                 [--prompt-style release|paper] [--rope ntk --scale 8 ...] [--backend hf|vllm]

Input: records with ``context`` and ``summary`` (the reference); ``id`` is optional (default: the line number),
``subset`` too. ``--data`` is a JSONL file, or (read with HF ``datasets``, imported only then) a Parquet file, a
``save_to_disk`` directory, a folder of JSONL/Parquet files, or a dataset name such as the CNNSum release
``CxsGHost/CNNSum`` (``--data-files cnnsum_L_16k.jsonl`` picks one of its four files); see
:mod:`evaluation.data`. Prompts come from :mod:`common.prompts` (baseline IE/IB in the release or paper
wording, or the fine-tuning F.2 prompts for fine-tuned models); no chat template unless ``--chat-template``.
Decoding: greedy, at least 10 new tokens, at most 400 (L, XL) / 500 (2XL, 3XL) or ``--max-new-tokens``; the
subset comes from ``--subset``, else the records' ``subset`` field (``data_concat sample`` writes it; all
records must agree), else the release file name (``cnnsum_XXL_64k.jsonl`` -> 2XL).

RoPE: ``--rope/--scale/...`` follow :func:`rope_scaling.apply_rope`'s rule, as every ropescale command does: on an
unscaled model they apply the method; on a model whose config already carries scaling, the same setting is a
no-op (noted on stderr), a different one is refused unless ``--replace``. Without flags the model runs as saved.

Long inputs (``--truncate``): by default nothing is cut (``none``), as in the paper, whose point is to measure how
models behave on inputs longer than their context window: HF computes rotary positions for any length, and the
vllm backend gets ``max_model_len`` = 2x the subset's target (the paper's rule), raised to fit the longest prompt
plus generation, with its precomputed rotary cache made to cover it (``max_position_embeddings`` raised for
plain / ntk / abf / pi rope); vLLM's dynamic NTK, and YaRN past vLLM's rotary cache, are refused (use the hf
backend there): see :func:`evaluation.backends.vllm_settings`. ``--truncate middle`` instead keeps the head and tail of the *context* (LongBench-style middle
truncation; the instructions around it are kept whole) so the prompt is at most ``--max-input-tokens`` tokens
(default: the model's extended context minus the max new tokens). run.json counts ``truncated`` samples and
``over_context`` samples (prompt + max new tokens beyond the extended context, i.e. extrapolated).

Output (a run directory, see :mod:`common.runs`): ``DIR/predictions.jsonl`` — one record per sample
(id, subset, prompt, input_tokens, truncated, new_tokens, prediction, reference), appended and fsynced as each
sample finishes — and ``DIR/run.json`` (model, rope spec, train_length, prompt, prompt_style, subset, backend,
versions, counts). Re-running the same command resumes: finished ids are skipped, a killed run loses at most
the samples in flight (one per slot / batch row) and never duplicates a record; re-running with different
settings into the same DIR is an error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import prompts, subsets
from common.io import InputError
from common.runs import RunDir, versions

from .backends import BACKENDS, CACHES, Item, make_backend, rope_overrides
from .data import (CNNSUM_HUB_ID, load_samples, open_source, parse_subset, records_subset,  # noqa: F401
                   subset_from_filename)

TRUNCATE = ("none", "middle")
# settings that must match for a run directory to be resumed (anything else may differ, e.g. batch size)
RESUME_KEYS = ("model", "data", "data_files", "data_split", "rope", "prompt", "prompt_style", "subset",
               "max_new_tokens", "min_new_tokens", "chat_template", "truncate", "max_input_tokens")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- inputs
def resolve_subset(name: str | None, data_path, samples: list[dict] | None = None,
                   label: str | None = None) -> subsets.Subset | None:
    """--subset (L, XL, 2XL, 3XL, or T<tokens> for a scaled-down subset), else the records' ``subset`` field (all
    records must agree; ``label`` names the data in that error), else the release file name, else None."""
    if name:
        return parse_subset(name)
    if samples:
        sub = records_subset(samples, label or str(data_path))
        if sub is not None:
            return sub
    return subset_from_filename(data_path)


def default_max_new_tokens(sub: subsets.Subset | None, data_path=None) -> int:
    """The subset's max new tokens (400 for L/XL, 500 for 2XL/3XL: paper Sec 4.2)."""
    if sub is None:
        raise InputError("cannot tell the subset: no --subset, the records carry no 'subset' field, and the file "
                         "name is not a release name (cnnsum_L_16k, cnnsum_XL_32k, cnnsum_XXL_64k, "
                         "cnnsum_XXXL_128k): pass --subset or --max-new-tokens", data_path)
    return sub.max_new_tokens


def check_out_dir(out) -> Path:
    """``--out`` must be a directory or not exist yet (it is created when the first file is written)."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise InputError("exists and is not a directory (--out takes a run directory)", p)
    return p


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


def prepare_config(model_dir: Path, spec, log=None):
    """(config, effective RopeSpec, hf_overrides): the saved config with ``spec`` applied by
    :func:`rope_scaling.apply_rope`, whose rule every entry point follows: method none (without ``--replace``) or
    the spec the config already carries is a no-op (noted on ``log``), a different spec on a scaled config is
    refused unless ``spec.replace``."""
    from transformers import AutoConfig

    from rope_scaling import apply_rope, plan_rope, read_rope

    config = AutoConfig.from_pretrained(str(model_dir))
    if spec is None:
        return config, read_rope(config), {}
    before = config.to_dict()
    try:
        change = plan_rope(config, spec)
        apply_rope(config, spec)
    except InputError as e:
        raise InputError(e.message, e.path or model_dir / "config.json", e.line) from None
    if change.action in ("unchanged", "replaced", "removed") and log is not None:
        log(f"[generate] note: {change.message()}")
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
             cache="slots", compile=False, cuda_graph=True, limit=None, progress=True, log=_log, hf_model=None,
             data_files=None, data_split=None, backends=None) -> dict:
    """Generate predictions for ``data`` into the run directory ``out`` (see module doc); returns a summary dict.

    ``data`` is anything :func:`evaluation.data.open_source` accepts (with ``data_files`` / ``data_split`` for
    datasets sources). ``rope`` is a :class:`rope_scaling.RopeSpec` (or None = the model as saved). ``hf_model``
    lets a caller pass an already-loaded model for the hf backend (tests, benchmarks); ``backends`` (a dict the
    caller keeps) lets consecutive calls reuse a loaded backend when its settings are the same (``run --data-dir``).
    """
    from transformers import AutoTokenizer
    from tqdm import tqdm

    from rope_scaling import extended_context
    from ropescale.tiny import resolve_model

    if data is None or out is None:
        raise InputError("generate needs --data FILE.jsonl and --out DIR")
    check_out_dir(out)
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if truncate not in TRUNCATE:
        raise InputError(f"unknown --truncate {truncate!r} (choose from {', '.join(TRUNCATE)})")
    prompt = prompt.lower()
    prompts.template(prompt, prompt_style)
    if max_new_tokens is not None and max_new_tokens < 1 or min_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 1 and --min-new-tokens >= 0 "
                         f"(got {max_new_tokens}, {min_new_tokens})")
    src = open_source(data, data_files, data_split)
    samples = load_samples(None, limit, source=src)
    sub = resolve_subset(subset, src.file_name, samples, src.label)
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(sub, src.label)
    model_dir = resolve_model(model)
    config, eff_rope, overrides = prepare_config(model_dir, rope, log=log)
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
        "data": src.label, "data_files": src.data_files, "data_split": src.split, "rope": eff_rope.to_dict(),
        "prompt": prompt,
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
    name = Path(src.label).name if src.path else src.label
    style = "" if settings["prompt_style"] is None else "/" + prompt_style
    log(f"[generate] {name}: {len(samples)} samples, {len(samples) - len(todo)} already done, {len(todo)} to go; "
        f"prompt {prompt}{style}, subset {settings['subset']}, max new tokens {max_new_tokens}, "
        f"rope {eff_rope.describe()}, extended context {ext_ctx}")

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
        need = max(len(it.input_ids) for it in items) + int(max_new_tokens)
        want = max(2 * sub.target if sub else 0, need)  # vllm: the paper's max_model_len, 2x the subset's target
        be = make_backend(backend, model_dir, config, tokenizer, device=device, dtype=dtype,
                          batch_tokens=batch_tokens, max_batch=max_batch, cache=cache, compile=compile,
                          cuda_graph=cuda_graph, model=hf_model, rope_overrides=overrides, max_model_len=want,
                          need_len=need, log=log, reuse=backends)
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
DATA_HELP = ("CNNSum-format data (context, summary[, id][, subset]): a JSONL file, a Parquet file, a directory "
             "(datasets save_to_disk, or a folder of JSONL/Parquet files), or a datasets name, e.g. the CNNSum "
             f"release {CNNSUM_HUB_ID} with --data-files cnnsum_L_16k.jsonl")


def add_generate_args(p: argparse.ArgumentParser, matrix: bool = False) -> None:
    """The generation flags (shared with ``eval_summ run``; ``matrix``: --data and --prompt are optional there,
    since ``run --data-dir`` replaces them)."""
    from rope_scaling import add_rope_args

    p.add_argument("--model", default="tiny", help="HF model directory, or 'tiny' (the embedded default)")
    p.add_argument("--data", required=not matrix, help=DATA_HELP)
    p.add_argument("--data-files", metavar="PATTERN",
                   help="with a directory or datasets name: which file(s) to load (datasets' data_files)")
    p.add_argument("--data-split", metavar="SPLIT", help="the split to read when the data has several")
    p.add_argument("--prompt", required=not matrix, choices=prompts.PROMPT_TYPES,
                   help="ie / ib: baseline prompts (Appendix F.1); ft-ie / ft-ib: fine-tuning prompts (F.2), "
                        "for models fine-tuned with them")
    p.add_argument("--prompt-style", default="release", choices=prompts.STYLES,
                   help="wording of ie/ib: the official release's strings (default) or the paper's Appendix F.1")
    p.add_argument("--out", required=True, help="run directory (resumed if it exists with the same settings)")
    p.add_argument("--subset", help="L, XL, 2XL, 3XL (or T<tokens> for a scaled-down subset); default: the records' "
                                    "'subset' field, else the release file name")
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
    return dict(model=args.model, data=args.data, data_files=args.data_files, data_split=args.data_split,
                prompt=args.prompt, out=args.out, prompt_style=args.prompt_style,
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
