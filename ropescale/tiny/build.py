"""Building the tiny default: its spec, its tokenizer and config, and the build itself, in named phases (the
novels read and tokenized, the model pretrained, what it can do measured, the directory written)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ropescale.common import compat
from ropescale.common.io import InputError, sha256_file, write_json_atomic
from ropescale.common.models import ASSET_JSON, MODEL_FILE
from ropescale.common.paths import CACHE_DIR, CHAPTERS_JSONL

from .metrics import copy_effect, perplexity, recall_score, windows
from .mixture import Mixture, pretrain

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the tiny default (its hash names the cache folder and is checked against the
    committed asset)."""

    vocab_size: int = 2048  # byte-level BPE: ~1.03 characters a token on the novels (the LM head is the main cost)
    arch: str = "qwen2"
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 704
    orig_ctx: int = 512
    rope_theta: float = 10000.0
    seed: int = 0
    threads: int = 2  # torch CPU threads during the build (results depend on the reduction order)
    tokenizer_chars: int = 3_000_000  # characters of novel text the tokenizer is trained on
    steps: int = 4000  # fixed step count (deterministic)
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 50
    short_steps: int = 800  # first phase: short windows (induction heads form on short repeats)
    short_len: int = 64
    short_batch: int = 64
    p_synth: float = 0.1  # after the short phase: share of repeated random-token windows
    p_task: float = 0.4  # windows starting with a recall sample (ropescale.common.recall, F.2 prompts)
    p_copy: float = 0.3  # windows of novel passages each repeated exactly further on
    heldout_per_book: int = 12  # last chapters of each book: never trained on (ropescale.common.recall.HELDOUT)
    heldout_windows: int = 24

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


DEFAULT_SPEC = TinySpec()


# ---------------------------------------------------------------- tokenizer and model
def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, model_max_length: int = 1 << 20):
    """Train a byte-level BPE tokenizer (Qwen2-like: no BOS, ``<|endoftext|>`` = EOS = PAD) and save it as an
    HF tokenizer in ``out_dir``. Returns the loaded ``PreTrainedTokenizerFast``. Deterministic for given texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   model_max_length=model_max_length)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def tiny_config(vocab_size: int, arch: str = "qwen2", hidden_size: int = 256, num_layers: int = 4, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 704, orig_ctx: int = 512, rope_theta: float = 10000.0,
                eos_token_id: int = 0):
    """An HF config for a tiny Llama / Qwen2 / Mistral model (same fields on transformers 4.x and 5.x)."""
    from transformers import AutoConfig

    kw = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
              num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
              max_position_embeddings=orig_ctx, rope_theta=rope_theta, tie_word_embeddings=True,
              eos_token_id=eos_token_id, pad_token_id=eos_token_id, bos_token_id=None)
    if arch in ("qwen2", "mistral"):
        kw["sliding_window"] = None
        kw["use_sliding_window"] = False
    if arch not in ("llama", "qwen2", "mistral"):
        raise InputError(f"unknown tiny architecture {arch!r} (llama, qwen2, mistral)")
    cfg = AutoConfig.for_model(arch, **kw)
    compat.set_config_dtype(cfg, "float32")  # transformers 5.x dtype / 4.x torch_dtype
    return cfg


def random_model(config, seed: int = 0):
    """A randomly initialised causal LM for ``config`` (fp32, eval mode), seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.float().eval()


def _token_stream(tokenizer, chapters: Sequence[dict]) -> list[int]:
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for ch in chapters:
        ids += tokenizer(ch["text"], add_special_tokens=False)["input_ids"] + [eos]
    return ids


# ---------------------------------------------------------------- the build, phase by phase
@dataclass
class Corpus:
    """The shared novels as a build reads them: the chapters split into training and held-out ones (the last
    ``heldout_per_book`` of each book), the tokenizer trained on the training ones, and both as token streams."""

    train_chs: list
    held_chs: list
    tok: object
    train_ids: list[int]
    held_ids: list[int]


@dataclass
class Measured:
    """What a build measured on the held-out chapters (recorded in tiny.json)."""

    ppl_random: float  # held-out perplexity before pretraining
    ppl: float  # and after
    copy: dict  # copy_loss, nocopy_loss (metrics.copy_effect)
    recall: dict  # recall ROUGE-L per F.2 prompt


def tiny_dir(spec: TinySpec = DEFAULT_SPEC, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a build of ``spec`` goes by default: ``$ROPESCALE_CACHE/tiny-<key>``."""
    return Path(cache_dir or CACHE_DIR) / f"tiny-{spec.key()}"


@contextlib.contextmanager
def _threads(n: int):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_tiny(spec: TinySpec = DEFAULT_SPEC, out_dir: str | os.PathLike | None = None,
               chapters_path: str | os.PathLike = CHAPTERS_JSONL, log=print, eval_every: int = 0,
               recall_n: int = 12, recall_new_tokens: int = 160) -> Path:
    """Build the tiny default into ``out_dir`` (atomically: built in a temp folder, then renamed). Deterministic
    for a spec on a given machine and torch version: ``spec.threads`` fixes the CPU thread count. The phases, in
    order: the novels read and the tokenizer trained -> a random model -> pretraining -> measuring -> writing.
    ``recall_n`` / ``recall_new_tokens``: the recall score's samples and answer budget (measured after the weights
    are final; not part of the spec's key)."""
    import torch

    from ropescale.common.io import atomic_dir

    out = Path(out_dir) if out_dir else tiny_dir(spec)
    t0 = time.time()
    with _threads(spec.threads), atomic_dir(out) as tmp:
        torch.manual_seed(spec.seed)
        corpus = read_corpus(spec, chapters_path, tmp, log)
        model = random_model(model_config(spec, corpus.tok), spec.seed)
        held_windows = windows(corpus.held_ids, spec.orig_ctx, spec.heldout_windows, spec.seed)
        ppl_random = perplexity(model, held_windows)
        hist = pretrain_tiny(model, spec, corpus, log, eval_every)
        measured = measure(model, spec, corpus, held_windows, ppl_random, log, recall_n, recall_new_tokens)
        write_build(model, tmp, spec, corpus, measured, hist, time.time() - t0)
    return out


def read_corpus(spec: TinySpec, chapters_path: str | os.PathLike, tok_dir: Path, log) -> Corpus:
    """Phase 1: the chapters split, a BPE tokenizer trained on the training ones (written into ``tok_dir``; with
    the recall task's prompts and marks, so their tokens exist) and both parts tokenized."""
    from ropescale.common import prompts
    from ropescale.common.chapters import read_chapters
    from ropescale.common.recall import mark, split_part

    chapters = read_chapters(chapters_path)
    train_chs = split_part(chapters, "train", spec.heldout_per_book)
    held_chs = split_part(chapters, "heldout", spec.heldout_per_book)
    train = [{"text": c.text} for c in train_chs]
    held = [{"text": c.text} for c in held_chs]
    log(f"[tiny] training a {spec.vocab_size}-token BPE tokenizer on {spec.tokenizer_chars:,} chars of the novels")
    texts, n = [], 0
    for ch in train:
        if n >= spec.tokenizer_chars:
            break
        texts.append(ch["text"])
        n += len(ch["text"])
    texts.append("\n".join(prompts.render(mark(k) + "。", p) for k in range(1, 10) for p in ("ft-ie", "ft-ib")) * 20)
    tok = train_tokenizer(texts, spec.vocab_size, tok_dir)
    log(f"[tiny] tokenizing {len(train)} train / {len(held)} held-out chapters")
    return Corpus(train_chs, held_chs, tok, _token_stream(tok, train), _token_stream(tok, held))


def model_config(spec: TinySpec, tok):
    """The HF config of a build of ``spec`` with tokenizer ``tok``."""
    return tiny_config(len(tok), spec.arch, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                       spec.intermediate_size, spec.orig_ctx, spec.rope_theta, eos_token_id=tok.eos_token_id)


def pretrain_tiny(model, spec: TinySpec, corpus: Corpus, log, eval_every: int) -> list[dict]:
    """Phase 2: pretraining on the mixture of :mod:`.mixture`; returns its log."""
    from ropescale.common.recall import sources

    nparams = sum(p.numel() for p in model.parameters())
    log(f"[tiny] pretraining {nparams / 1e6:.1f}M params for {spec.steps} steps x {spec.batch_size} x "
        f"{spec.orig_ctx} tokens on {len(corpus.train_ids):,} novel tokens (context {spec.orig_ctx})")
    mixture = Mixture(spec, corpus.tok, corpus.train_ids, sources(corpus.train_chs, corpus.tok), spec.seed)

    def probe(m):
        return copy_effect(m, corpus.held_ids, seq_len=spec.orig_ctx, n=4)

    return pretrain(model, mixture, lr=spec.lr, steps=spec.steps, warmup=spec.warmup, seed=spec.seed,
                    on_eval=probe, eval_every=eval_every)


def measure(model, spec: TinySpec, corpus: Corpus, held_windows, ppl_random: float, log, recall_n: int = 12,
            recall_new_tokens: int = 160) -> Measured:
    """Phase 3: held-out perplexity, the copy effect and recall ROUGE-L with both F.2 prompts (``recall_n`` samples,
    greedy answers of up to ``recall_new_tokens`` tokens)."""
    from ropescale.common.recall import recall_samples, sources

    ppl = perplexity(model, held_windows)
    ce = copy_effect(model, corpus.held_ids, seq_len=spec.orig_ctx)
    held_src = sources(corpus.held_chs, corpus.tok)
    rec = recall_samples(held_src, corpus.tok, n=recall_n, target=spec.orig_ctx - 160, seed=spec.seed)  # + 160: 512
    rs = {p: recall_score(model, corpus.tok, rec, p, max_new_tokens=recall_new_tokens) for p in ("ft-ie", "ft-ib")}
    log(f"[tiny] held-out perplexity: trained {ppl:.1f} vs random {ppl_random:.1f}; copy loss "
        f"{ce['copy_loss']:.2f} vs {ce['nocopy_loss']:.2f} without the copy; recall ROUGE-L {rs}")
    return Measured(ppl_random, ppl, ce, rs)


def write_build(model, tmp: Path, spec: TinySpec, corpus: Corpus, m: Measured, hist: list[dict],
                seconds: float) -> None:
    """Phase 4: the weights and the build's record (``tiny.json``: spec, key, sha256, metrics, log, versions)."""
    import torch
    import transformers

    model.generation_config.pad_token_id = corpus.tok.eos_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    write_json_atomic(tmp / ASSET_JSON, {
        "spec": asdict(spec), "key": spec.key(), "sha256": {MODEL_FILE: sha256_file(tmp / MODEL_FILE)},
        "params": sum(p.numel() for p in model.parameters()), "train_tokens": len(corpus.train_ids),
        "heldout_tokens": len(corpus.held_ids), "heldout_chapters": [f"{c.book}:{c.chapter}" for c in corpus.held_chs],
        "ppl_heldout": m.ppl, "ppl_heldout_random": m.ppl_random, **m.copy, "recall_rouge_l": m.recall,
        "train_log": hist, "build_seconds": round(seconds, 1),
        "built_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                       "threads": spec.threads, "python": sys.version.split()[0]},
    })


def built(spec: TinySpec = DEFAULT_SPEC) -> Path | None:
    """A finished build of ``spec``, never building one: the committed asset when it is a build of ``spec`` (its
    weights checked), else the cache folder's build, else None."""
    from ropescale.common.models import asset_info, tiny_asset, verify_build

    info = asset_info()
    if info is not None and info.get("key") == spec.key():
        return tiny_asset()
    d = tiny_dir(spec)
    return verify_build(d) if (d / ASSET_JSON).is_file() else None
