"""``eval_summ generate``: greedy summaries for CNNSum-format data, the paper's way (Sec 4.2, Appendix B.1).

    python eval_summ.py generate --model PATH|tiny --data FILE.jsonl|DIR|NAME --prompt ie|ib|ft-ie|ft-ib --out DIR
                                 [--prompt-style release|paper] [--rope ntk --scale 8 ...] [--backend hf|vllm]

Input: records with ``context`` and ``summary`` (the reference); ``id`` is optional (default: the line number),
``subset`` too. ``--data`` is a JSONL file, or (read with HF ``datasets``, imported only then) a Parquet file, a
``save_to_disk`` directory, a folder of JSONL/Parquet files, or a dataset name such as the CNNSum release
``CxsGHost/CNNSum`` (``--data-files cnnsum_L_16k.jsonl`` picks one of its four files); see
:mod:`ropescale.evaluation.data`. Prompts come from :mod:`ropescale.common.prompts` (baseline IE/IB in the release or
paper wording, or the fine-tuning F.2 prompts for fine-tuned models); no chat template unless ``--chat-template``.
Decoding: greedy, at most 400 (L, XL) / 500 (2XL, 3XL) new tokens (paper Sec 4.2) or ``--max-new-tokens``, at least 10
(the official release's Inference.py, ``min_tokens=10``; not in the paper) or ``--min-new-tokens``; the subset comes
from ``--subset``, else the records' ``subset`` field (``data_concat sample`` writes it; all records must agree), else
the release file name (``cnnsum_XXL_64k.jsonl`` -> 2XL).

RoPE: ``--rope/--scale/...`` follow :func:`rope_scaling.apply_rope`'s rule, as every ropescale command does: on an
unscaled model they apply the method; on a model whose config already carries scaling, the same setting is a
no-op (noted on stderr), a different one is refused unless ``--replace``. Without flags the model runs as saved.

Long inputs (``--truncate``): by default nothing is cut (``none``), as in the paper, whose point is to measure how
models behave on inputs longer than their context window: HF computes rotary positions for any length, and the
vllm backend gets ``max_model_len`` = 2x the subset's target (the release's Inference.py sizing; not in the
paper), raised to fit the longest prompt plus generation, with its precomputed rotary cache made to cover it
(``max_position_embeddings`` raised for plain / ntk / abf / pi rope); what vLLM would compute otherwise than
transformers is refused (use the hf backend there): see :func:`ropescale.evaluation.backends.vllm.vllm_settings`.
``--truncate middle`` instead keeps the head and tail of the *context* (LongBench-style middle truncation; the
instructions around it are kept whole) so the prompt is at most ``--max-input-tokens`` tokens (default: the model's
extended context minus the max new tokens). run.json counts ``truncated`` samples and ``over_context`` samples
(prompt + max new tokens beyond the extended context, i.e. extrapolated). The extended context is the one the
setting serves (``rope_scaling.hf.served_context``): with ``--attention-extend`` the method's reach (Self-Extend
(C - W) G + W; DCA: any length, run.json's ``context`` null).

Output (a run directory, see :mod:`ropescale.common.runs`): ``DIR/predictions.jsonl`` — one record per sample
(id, subset, prompt, input_tokens, truncated, new_tokens, prediction, reference), appended and fsynced as each
sample finishes — and ``DIR/run.json`` (the run record: model, model_id, rope spec, context, the model's training
record, data, the settings -- prompt, prompt_style, subset, backend... --, counts, versions). Re-running the same
command resumes (``--resume auto``, the default; ``--resume never`` refuses a DIR that holds a run): finished ids
are skipped, a killed run loses at most the samples in flight (one per slot / batch row) and never duplicates a
record. Re-running with different settings, or with another model (even at the same path: the model's id is
compared), into the same DIR is an error, and so is a DIR holding another kind of run.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rope_scaling import RopeSpec
from ropescale.common import prompts, subsets
from ropescale.common.cli import (
    add_command,
    add_json,
    add_resume,
    doc_sections,
    print_result,
    rerun_command,
    when_interrupted,
)
from ropescale.common.io import InputError
from ropescale.common.models import MODEL_HELP, is_tiny
from ropescale.common.runs.identity import model_id as model_id_of
from ropescale.common.runs.identity import model_ref
from ropescale.common.runs.locks import run_dir_scope
from ropescale.common.runs.record import RunDir, RunRecord, read_train_record, settings_record
from ropescale.common.runs.resume import check_resume, open_run_dir
from ropescale.common.settings import add_settings, from_args, nested, require, setting

from .backends import BackendSettings, Item, make_backend
from .data import CNNSUM_HUB_ID, load_samples, open_source, records_subset

TRUNCATE = ("none", "middle")
MORE_DATA = "advanced: data and prompt"
DECODING = "advanced: decoding and long inputs"
NEEDS = ("data", "prompt", "out")  # what a generation needs that has no default
DATA_HELP = ("CNNSum-format data (context, summary[, id][, subset]): a JSONL file, a Parquet file, a directory "
             "(datasets save_to_disk, or a folder of JSONL/Parquet files), or a datasets name, e.g. the CNNSum "
             f"release {CNNSUM_HUB_ID} with --data-files cnnsum_L_16k.jsonl")


@dataclass(frozen=True)
class GenerateSettings:
    """Every setting of ``eval_summ generate`` (and of ``run``, which generates). A run directory may be resumed
    only with the same settings, except those marked ``resume="ignore"`` (and the backend's)."""

    model: str = setting("tiny", MODEL_HELP)
    data: str | None = setting(None, DATA_HELP, metavar="DATA")
    prompt: str | None = setting(None, "ie / ib: the baseline prompts (Appendix F.1); ft-ie / ft-ib: the "
                                       "fine-tuning prompts (F.2), for models fine-tuned with them",
                                 choices=prompts.PROMPT_TYPES)
    out: str | None = setting(None, "run directory (resumed when it holds a run with the same settings)",
                              metavar="DIR", resume="ignore")
    data_files: str | None = setting(None, "with a directory or datasets name: which file(s) to load (datasets' "
                                           "data_files)", metavar="PATTERN", group=MORE_DATA)
    data_split: str | None = setting(None, "the split to read when the data has several", metavar="SPLIT",
                                     group=MORE_DATA)
    prompt_style: str | None = setting("release", "wording of ie/ib: the official release's strings or the "
                                                  "paper's Appendix F.1", choices=prompts.STYLES, group=MORE_DATA)
    subset: str | None = setting(None, "L, XL, 2XL, 3XL (or T<tokens> for a scaled-down subset); default: the "
                                       "records' 'subset' field, else the release file name")
    max_new_tokens: int | None = setting(None, "default: 400 for L/XL, 500 for 2XL/3XL (paper Sec 4.2)",
                                         check=(lambda v: v >= 1, ">= 1"), metavar="N", group=DECODING)
    min_new_tokens: int = setting(subsets.MIN_NEW_TOKENS, "at least this many new tokens (EOS suppressed before)",
                                  check=(lambda v: v >= 0, ">= 0"), metavar="N", group=DECODING)
    chat_template: bool = setting(False, "wrap the prompt in the tokenizer's chat template", group=MORE_DATA)
    truncate: str = setting("none", "none (the paper's extrapolation setting) or middle (cut the context's middle "
                                    "to --max-input-tokens)", choices=TRUNCATE, group=DECODING)
    max_input_tokens: int | None = setting(None, "with --truncate middle; default: the extended context minus the max "
                                                 "new tokens", check=(lambda v: v >= 1, ">= 1"), metavar="N",
                                         group=DECODING)
    limit: int | None = setting(None, "only the first N samples", check=(lambda v: v >= 1, ">= 1"), metavar="N",
                                resume="ignore")
    rope: RopeSpec = nested(RopeSpec, resume="ignore")  # resume compares the rope the model runs with
    backend: BackendSettings = nested(BackendSettings, resume="ignore")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- inputs
def resolve_subset(name: str | None, data_path, samples: list[dict] | None = None,
                   label: str | None = None) -> subsets.Subset | None:
    """--subset (L, XL, 2XL, 3XL, or T<tokens> for a scaled-down subset), else the records' ``subset`` field (all
    records must agree; ``label`` names the data in that error), else the release file name, else None."""
    if name:
        return subsets.parse(name)
    if samples:
        sub = records_subset(samples, label or str(data_path))
        if sub is not None:
            return sub
    return subsets.from_filename(data_path)


def default_max_new_tokens(sub: subsets.Subset | None, data_path=None) -> int:
    """The subset's max new tokens (400 for L/XL, 500 for 2XL/3XL: paper Sec 4.2)."""
    if sub is None:
        raise InputError("cannot tell the subset: no --subset, the records carry no 'subset' field, and the file "
                         "name is not a release name (cnnsum_L_16k, cnnsum_XL_32k, cnnsum_XXL_64k, "
                         "cnnsum_XXXL_128k): pass --subset or --max-new-tokens", data_path)
    return sub.max_new_tokens


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
POSITIONAL = ("model", "data", "prompt", "out")


@run_dir_scope()
def generate(settings: GenerateSettings | None = None, *args, progress: bool = True, log=_log, hf_model=None,
             backends: dict | None = None, resume: str = "auto", **fields) -> dict:
    """Generate predictions into the run directory ``settings.out`` (see module doc); returns a summary dict.

    ``generate(GenerateSettings(...))``, or the settings spelled out: ``generate(model, data, prompt, out,
    max_new_tokens=10, rope=RopeSpec("ntk", 8), cache="static", ...)`` (any :class:`GenerateSettings` key).
    ``hf_model`` lets a caller pass an already-loaded model for the hf backend (tests, benchmarks); ``backends`` (a
    dict the caller keeps) lets consecutive calls reuse a loaded backend when its settings are the same (``run
    --data-dir``). ``resume``: "auto" continues a run ``out`` holds, "never" refuses one (``runs.RESUME_HELP``).
    """
    from ropescale.common.settings import check, make

    if not isinstance(settings, GenerateSettings):
        fields.update(zip(POSITIONAL, (settings,) + args))
        fields = {k: v for k, v in fields.items() if not (k in POSITIONAL and v is None)}
        settings = make(GenerateSettings, **fields)
    elif fields or args:
        settings = make(GenerateSettings, settings, **fields)
    check(settings)
    return _generate(settings, progress=progress, log=log, hf_model=hf_model, backends=backends, resume=resume)


@dataclass
class Generation:
    """One generation as its phases build it: :func:`plan_generation` fills the first block (nothing written yet),
    :func:`prepare_items` the tokenized prompts, :func:`start_run` the run record."""

    settings: GenerateSettings  # as resolved: model and data as found, prompt, subset, token limits, out
    cfg: Any  # rope_scaling.load.ModelConfig: the model's config with the RoPE flags applied, read once
    src: Any  # the data source (evaluation.data.open_source)
    samples: list[dict]
    sub: subsets.Subset | None
    model_id: str | None
    run: RunDir
    old: Any  # the run being resumed (runs.RunMeta) or None
    predictions: Any  # the run's append-only predictions.jsonl (runs.RecordLog)
    todo: list[dict]  # the samples not predicted yet
    t_start: float
    items: list[Item] = field(default_factory=list)  # prepare_items
    tokenizer: Any = None
    record: RunRecord | None = None  # start_run

    @property
    def max_new_tokens(self) -> int:
        return int(self.settings.max_new_tokens)

    @property
    def before(self) -> float:
        """The seconds of the run's earlier parts."""
        return self.old.seconds if self.old is not None else 0.0


def _generate(s: GenerateSettings, *, progress, log, hf_model, backends, resume="auto") -> dict:
    """The phases, in order: inputs -> prompts -> backend and run record -> decoding -> counts."""
    g = plan_generation(s, log, resume)
    when_interrupted(f"the predictions so far are kept; to continue, run the same command again: {rerun_command()}")
    prepare_items(g)
    warn_context(g, log)
    check_memory(g, hf_model)
    be = start_run(g, hf_model=hf_model, backends=backends, log=log)
    seconds = decode(g, be, progress) if be is not None else 0.0
    return finish_run(g, seconds, log)


def plan_generation(s: GenerateSettings, log, resume: str = "auto") -> Generation:
    """Phase 1, inputs: the run directory, the data and its subset, the model's config with the RoPE flags (read
    once), the token limits, the settings as resolved and the resume check. Nothing is written."""
    from rope_scaling.load import load_config
    from ropescale.common.models import resolve_model

    t_start = time.time()
    require(s, NEEDS)
    out, old = open_run_dir(s.out, "generate", resume=resume)  # a file, another kind of run's: refused before any work
    prompt = s.prompt.lower()
    prompts.template(prompt, s.prompt_style or "release")
    src = open_source(s.data, s.data_files, s.data_split)
    samples = load_samples(None, s.limit, source=src)
    sub = resolve_subset(s.subset, src.file_name, samples, src.label)
    max_new_tokens = s.max_new_tokens or default_max_new_tokens(sub, src.label)
    model_dir = resolve_model(s.model)
    cfg = load_config(model_dir, s.rope)  # read once: every phase uses this object
    if cfg.change.action in ("unchanged", "replaced", "removed"):
        log(f"[generate] note: {cfg.change.message()}")
    max_input_tokens = input_limit(s, cfg.context, max_new_tokens)
    # the settings as resolved (what a resume must match): the model and data as found, subset, token limits
    mid = model_id_of(model_dir)
    resolved = dataclasses.replace(
        s, model=model_ref(s.model, model_dir), data=src.label, data_files=src.data_files, data_split=src.split,
        prompt=prompt, prompt_style=s.prompt_style if prompt in ("ie", "ib") else None,
        subset=sub.name if sub else None, max_new_tokens=int(max_new_tokens), max_input_tokens=max_input_tokens,
        out=str(out))
    run = RunDir(out)
    if old is not None:
        check_resume(old, resolved, rope=cfg.rope, model_id=mid, hint="use another --out or remove it")
    predictions = run.log("predictions.jsonl")
    todo = [x for x in samples if x["id"] not in predictions]
    name = Path(src.label).name if src.path else src.label
    style = "" if resolved.prompt_style is None else "/" + resolved.prompt_style
    log(f"[generate] {name}: {len(samples)} samples, {len(samples) - len(todo)} already done, {len(todo)} to go; "
        f"prompt {prompt}{style}, subset {resolved.subset}, max new tokens {max_new_tokens}, "
        f"rope {cfg.rope.label()}, extended context {context_text(cfg.context)}")
    return Generation(resolved, cfg, src, samples, sub, mid, run, old, predictions, todo, t_start)


def context_text(ctx: int | None) -> str:
    """A served context in a sentence: its tokens, or "unbounded" (None: an attention method that serves any
    length)."""
    return "unbounded" if ctx is None else str(ctx)


def beyond_context(ctx: int | None, tokens: int) -> bool:
    """Whether ``tokens`` (prompt + max new tokens) run past the served context ``ctx`` (None: never)."""
    return ctx is not None and tokens > ctx


def input_limit(s: GenerateSettings, ext_ctx: int | None, max_new_tokens: int) -> int | None:
    """``--max-input-tokens`` as it applies: with ``--truncate middle`` (default: the extended context less the
    new tokens), refused without it."""
    if s.truncate != "middle":
        if s.max_input_tokens is not None:
            raise InputError("--max-input-tokens needs --truncate middle")
        return None
    if s.max_input_tokens is None and ext_ctx is None:
        raise InputError("--truncate middle: the setting serves any length (an unbounded --attention-extend), so "
                         "there is no default input limit; pass --max-input-tokens")
    limit = s.max_input_tokens or ext_ctx - max_new_tokens
    if limit < 1:
        raise InputError(f"the extended context ({ext_ctx}) leaves no room for the input after {max_new_tokens} "
                         f"new tokens; pass --max-input-tokens")
    return limit


def prepare_items(g: Generation) -> None:
    """Phase 2, prompts: each sample still to do rendered with its prompt and tokenized once (middle-truncated
    with ``--truncate middle``)."""
    from transformers import AutoTokenizer

    s = g.settings
    g.tokenizer = AutoTokenizer.from_pretrained(str(g.cfg.path))
    tk = Tokenize(g.tokenizer, s.prompt, s.prompt_style or "release", s.chat_template)
    for x in g.todo:
        if s.truncate == "middle":
            ids, cut = tk.middle_truncated(x["context"], s.max_input_tokens)
        else:
            ids, cut = tk.ids(x["context"]), False
        g.items.append(Item(x["id"], ids, {"reference": x["reference"], "truncated": cut}))


def warn_context(g: Generation, log) -> None:
    """Before the model loads: how many inputs do not fit the model's (extended) context with the new tokens --
    middle-truncated with ``--truncate middle``, else run past it (extrapolation, the paper's setting, where a
    small model scores near 0) -- and an eval set that fits."""
    s, ctx, mnt = g.settings, g.cfg.context, g.max_new_tokens
    if ctx is None:  # a setting that serves any length
        return
    over = sum(1 for it in g.items if it.extra["truncated"] or beyond_context(ctx, len(it.input_ids) + mnt))
    if not over:
        return
    fate = ("middle-truncated to fit" if s.truncate == "middle" else
            "run beyond the model's positions (extrapolation; scores near 0 are likely)")
    log(f"[generate] warning: {over} of {len(g.items)} samples are longer than the model's {ctx}-token context "
        f"less {g.max_new_tokens} new tokens: they will be {fate}. {fitting_eval_set(g)}")


def check_memory(g: Generation, hf_model=None):
    """Before the model loads (hf backend): the longest sample alone -- its prompt's forward, the KV cache of the
    prompt and the new tokens, the last position's logits, and the weights unless ``hf_model`` is loaded already --
    fits the device's memory now (``ropescale.common.forward_memory.check_forward``), or one line naming the
    longest prompt that would. Batching is the backend's (its token budget); vLLM sizes its own memory. Returns
    the estimate (None when not checked)."""
    from ropescale.common.forward_memory import check_forward, weight_bytes

    s = g.settings
    if s.backend.backend != "hf" or not g.items:
        return None
    from .backends.hf import pick_device, pick_dtype

    device = pick_device(s.backend.device)
    b = pick_dtype(s.backend.dtype, device).itemsize
    longest = max(g.items, key=lambda it: len(it.input_ids))
    n = len(longest.input_ids)
    weights = 0 if hf_model is not None else weight_bytes(g.cfg.path, b)
    return check_forward(g.cfg.config, n, what=f"sample {longest.id} ({n:,} prompt tokens)", scored=1,
                         dtype_bytes=b, kv_tokens=n + g.max_new_tokens, weights=weights, device=device,
                         hint="--truncate middle --max-input-tokens N cuts prompts to N")


def fitting_eval_set(g: Generation) -> str:
    """How to get an eval set that fits the model (a sentence with the commands): ``data_concat sample`` over the
    shared novels' paragraphs at the largest scaled-down target whose longest window, rendered with this run's
    prompt, leaves room for the new tokens, then this generation with ``--max-new-tokens`` kept (a T<N> subset's
    own default is the paper's 400)."""
    import shlex

    from ropescale.common.paths import CHAPTERS_JSONL

    s = g.settings
    prompt = len(Tokenize(g.tokenizer, s.prompt, s.prompt_style or "release", s.chat_template).ids(""))
    room = g.cfg.context - g.max_new_tokens - prompt - 2  # (2: tokens a context can merge with at its edges)
    target = int(room / 1.125)  # a scaled-down subset's range ends at 18/16 of its target (the L preset's shape)
    while target > 0 and subsets.scaled(target).range[1] > room:
        target -= 1
    if target < 32:
        return (f"The {g.cfg.context}-token context leaves {max(room, 0)} tokens for a context after the prompt and "
                f"{g.max_new_tokens} new tokens: a smaller --max-new-tokens, or a larger --scale.")
    here = Path.cwd()
    chapters = str(CHAPTERS_JSONL)
    if CHAPTERS_JSONL.is_relative_to(here.parent):
        chapters = os.path.relpath(CHAPTERS_JSONL, here)
    tok = "" if is_tiny(s.model) else f" --tokenizer {shlex.quote(str(s.model))}"
    return (f"An eval set that fits: python -m data_concat sample --chapters {shlex.quote(chapters)}{tok} "
            f"--subset-tokens {target} --unit paragraph --max-samples 200 --out eval_fit.jsonl, then this command "
            f"with --data eval_fit.jsonl --max-new-tokens {g.max_new_tokens}")


def start_run(g: Generation, *, hf_model, backends, log):
    """Phase 3, the backend and the run record: the backend first (one that cannot start, no vllm or no GPU,
    leaves no run directory behind), then run.json. Returns the backend (None when nothing is left to do)."""
    s = g.settings
    g.record = RunRecord("generate", model=s.model, model_id=g.model_id, rope=g.cfg.rope.to_dict(),
                         context=g.cfg.context, train=read_train_record(g.cfg.path), data=g.src.label,
                         settings=settings_record(s), info={"n_samples": len(g.samples)}, seconds=g.before)
    be = None
    if g.items:
        need = max(len(it.input_ids) for it in g.items) + g.max_new_tokens
        short = min(len(it.input_ids) for it in g.items) + g.max_new_tokens
        want = max(2 * g.sub.target if g.sub else 0, need)  # vllm: 2x the subset's target (the release's Inference.py)
        be = make_backend(s.backend, g.cfg, g.tokenizer, model=hf_model, max_model_len=want, need_len=need,
                          short_len=short, log=log, reuse=backends)
        g.record.info["backend_info"] = be.describe()
    if g.old is not None:  # resuming: keep when the run began
        g.record.created = g.old.get("created")
    g.run.write_record(g.record)
    return be


def decode(g: Generation, be, progress: bool) -> float:
    """Phase 4, decoding: every item through the backend, each prediction appended (and fsynced) as it finishes.
    Returns the seconds it took."""
    from tqdm import tqdm

    s = g.settings
    t0 = time.time()
    bar = tqdm(total=len(g.items), desc=f"generate {s.prompt}", unit="sample", file=sys.stderr, disable=not progress,
               dynamic_ncols=True)
    new_tok = [0]

    def on_done(it: Item, out_ids: list[int]) -> None:
        g.predictions.append({
            "id": it.id, "subset": s.subset, "prompt": s.prompt, "input_tokens": len(it.input_ids),
            "truncated": it.extra["truncated"], "new_tokens": len(out_ids),
            "prediction": g.tokenizer.decode(out_ids, skip_special_tokens=True), "reference": it.extra["reference"]})
        new_tok[0] += len(out_ids)
        bar.update(1)
        bar.set_postfix(tok_s=f"{new_tok[0] / max(time.time() - t0, 1e-9):.1f}")

    be.generate(g.items, g.max_new_tokens, int(s.min_new_tokens), on_done)
    bar.close()
    return time.time() - t0


def finish_run(g: Generation, seconds: float, log) -> dict:
    """Phase 5, counts: run.json closed (complete or partial, the whole run's seconds, the counts); the summary."""
    ids = {x["id"] for x in g.samples}
    done = [r for r in g.predictions.records() if r["id"] in ids]
    mnt, items = g.max_new_tokens, g.items
    counts = {
        "done": len(done), "truncated": sum(bool(r.get("truncated")) for r in done),
        "over_context": sum(beyond_context(g.cfg.context, r["input_tokens"] + mnt) for r in done),
        "hit_max_new_tokens": sum(r.get("new_tokens", 0) >= mnt for r in done),
    }
    rec = g.record
    rec.status = "complete" if len(done) == len(g.samples) else "partial"
    rec.seconds = round(g.before + time.time() - g.t_start, 2)
    rec.info.update(counts=counts, last_seconds=round(seconds, 2),
                    last_samples_per_hour=round(len(items) * 3600 / seconds, 1) if items and seconds > 0 else None)
    g.run.write_record(rec)
    log(f"[generate] wrote {len(done)} predictions to {g.run.path / 'predictions.jsonl'} "
        f"({len(items)} new in {seconds:.1f}s; {counts['truncated']} truncated, {counts['over_context']} beyond "
        f"the extended context)")
    return {"out": str(g.run.path), "samples": len(g.samples), "generated": len(items), "seconds": round(seconds, 2),
            **counts}


# ---------------------------------------------------------------- CLI
def cmd_generate(args) -> int:
    res = generate(from_args(args, GenerateSettings), resume=args.resume)
    return print_result(res, args.json, f"{res['out']}: {res['done']} of {res['samples']} predictions "
                                        f"({res['generated']} new in {res['seconds']:.1f}s; {res['truncated']} "
                                        f"truncated, {res['over_context']} beyond the extended context)")


def register(subparsers) -> None:
    p = add_command(subparsers, "generate", help="greedy summaries for CNNSum-format data (hf or vllm backend), "
                                                 "resumable", **doc_sections(__doc__, more="docs/usage.md (generate)"))
    add_settings(p, GenerateSettings, required=NEEDS)
    add_resume(p, "auto")
    add_json(p, "the summary (out, samples, generated, seconds, counts)")
    p.set_defaults(func=cmd_generate)
