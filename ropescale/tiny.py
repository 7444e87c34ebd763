"""The embedded tiny default model: what ``--model tiny`` (the default of every CLI) resolves to.

Built deterministically, offline, on CPU from the shared novels and cached under ``$ROPESCALE_CACHE/tiny-<hash>``:
1. a byte-level BPE tokenizer (small vocabulary) trained on the novels, saved as an HF tokenizer;
2. a tiny Qwen2-architecture model (Llama-style RoPE, RMSNorm, SwiGLU) with a short original context
   (512 tokens, rope_theta 10000), pretrained for a few minutes on the novels;
3. ``tiny.json`` beside it with the spec, the training log and the held-out perplexity of the trained model vs
   the same architecture with random weights (so extrapolation results are known to be signal, not noise).

``python -m ropescale make-tiny`` builds it; :func:`resolve_model` builds it on first use.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from common.io import InputError, write_json_atomic
from common.paths import CACHE_DIR, CHAPTERS_JSONL

EOS = "<|endoftext|>"
TINY_NAMES = ("tiny", "")


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the tiny default (its hash names the cache folder)."""

    vocab_size: int = 6000
    arch: str = "qwen2"
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 704
    orig_ctx: int = 512
    rope_theta: float = 10000.0
    seed: int = 0
    tokenizer_chars: int = 3_000_000  # characters of novel text the tokenizer is trained on
    steps: int = 700  # fixed step count (deterministic; ~5 min on 2 idle CPU cores)
    batch_size: int = 4
    lr: float = 3e-3
    copy_prob: float = 0.3  # share of windows in which a passage is repeated later in the window
    heldout_per_book: int = 2  # last chapters of each book held out for perplexity
    heldout_windows: int = 24

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


DEFAULT_SPEC = TinySpec()


# ---------------------------------------------------------------- data
def load_chapters(path: str | os.PathLike = CHAPTERS_JSONL) -> list[dict]:
    """The shared novels, one chapter a row: {book, chapter, title, text} (read by ropescale.chapters)."""
    from common.chapters import read_chapters

    return [{"book": c.book, "chapter": c.chapter, "title": c.title, "text": c.text} for c in read_chapters(path)]


def split_chapters(chapters: Sequence[dict], heldout_per_book: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out): the last ``heldout_per_book`` chapters of each book are held out."""
    by_book: dict[str, list[dict]] = {}
    for ch in chapters:
        by_book.setdefault(ch["book"], []).append(ch)
    train, held = [], []
    for rows in by_book.values():
        train += rows[: len(rows) - heldout_per_book]
        held += rows[len(rows) - heldout_per_book:]
    return train, held


# ---------------------------------------------------------------- tokenizer
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


# ---------------------------------------------------------------- model
def tiny_config(vocab_size: int, arch: str = "qwen2", hidden_size: int = 256, num_layers: int = 4, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 704, orig_ctx: int = 512, rope_theta: float = 10000.0,
                eos_token_id: int = 0):
    """An HF config for a tiny Llama / Qwen2 / Mistral model (same fields on transformers 4.x and 5.x)."""
    from transformers import AutoConfig

    kw = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
              num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
              max_position_embeddings=orig_ctx, rope_theta=rope_theta, tie_word_embeddings=True,
              eos_token_id=eos_token_id, pad_token_id=eos_token_id, bos_token_id=None, torch_dtype="float32")
    if arch in ("qwen2", "mistral"):
        kw["sliding_window"] = None
        kw["use_sliding_window"] = False
    if arch not in ("llama", "qwen2", "mistral"):
        raise InputError(f"unknown tiny architecture {arch!r} (llama, qwen2, mistral)")
    cfg = AutoConfig.for_model(arch, **kw)
    cfg.torch_dtype = "float32"
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


def windows(ids: Sequence[int], length: int, n: int, seed: int) -> list[list[int]]:
    """``n`` evenly spaced windows of ``length`` tokens (deterministic; ``seed`` shifts the grid)."""
    span = len(ids) - length - 1
    if span <= 0:
        raise InputError(f"text too short for {length}-token windows ({len(ids)} tokens)")
    off = random.Random(seed).randrange(max(1, span // max(n, 1)))
    step = max(1, span // max(n, 1))
    return [list(ids[s:s + length]) for s in range(off, span, step)][:n]


def perplexity(model, batches: Sequence[Sequence[int]], batch_size: int = 8) -> float:
    """exp(mean next-token NLL) of ``model`` over token windows."""
    import torch

    model.eval()
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(batches), batch_size):
            x = torch.tensor(batches[i:i + batch_size])
            logits = model(input_ids=x).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     x[:, 1:].reshape(-1), reduction="sum")
            tot += float(loss)
            cnt += x[:, 1:].numel()
    return math.exp(tot / max(cnt, 1))


def sample_window(ids: Sequence[int], seq_len: int, rng: random.Random, copy_prob: float) -> list[int]:
    """A random ``seq_len`` window of the novels; with probability ``copy_prob`` a 16–64-token passage of its
    first half is repeated further on (at a distance of up to ~seq_len), so the model learns to use distant
    context inside its original window (the behaviour whose extrapolation the probes and RoPE methods test)."""
    s = rng.randrange(len(ids) - seq_len - 1)
    w = list(ids[s:s + seq_len])
    if rng.random() < copy_prob:
        n = rng.randint(16, 64)
        src = rng.randrange(0, seq_len // 2 - n)
        dst = rng.randrange(src + n + 8, seq_len - n)
        w[dst:dst + n] = w[src:src + n]
    return w


def pretrain(model, train_ids: Sequence[int], *, seq_len: int, batch_size: int, lr: float, steps: int,
             seed: int, copy_prob: float = 0.0) -> list[dict]:
    """Next-token pretraining on random windows for a fixed number of steps (AdamW, 30 warm-up steps, cosine
    decay to 10%). Deterministic for a seed on a given machine. Returns the log (step, loss, seconds)."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    hist: list[dict] = []
    t0 = time.time()
    ema = None
    for step in tqdm(range(steps), desc="pretrain tiny", unit="step", file=sys.stderr, leave=False):
        cur_lr = lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x = torch.tensor([sample_window(train_ids, seq_len, rng, copy_prob) for _ in range(batch_size)])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        cur = loss.item()
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        if step % 50 == 0 or step == steps - 1:
            hist.append({"step": step, "loss": round(cur, 4), "loss_ema": round(ema, 4),
                         "seconds": round(time.time() - t0, 1)})
    model.eval()
    return hist


# ---------------------------------------------------------------- build + cache
def tiny_dir(spec: TinySpec = DEFAULT_SPEC, cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or CACHE_DIR) / f"tiny-{spec.key()}"


def build_tiny(spec: TinySpec = DEFAULT_SPEC, out_dir: str | os.PathLike | None = None,
               chapters_path: str | os.PathLike = CHAPTERS_JSONL, log=print) -> Path:
    """Build the tiny default into ``out_dir`` (atomically: built in a temp folder, then renamed)."""
    import torch

    out = Path(out_dir) if out_dir else tiny_dir(spec)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.time()
    torch.manual_seed(spec.seed)
    chapters = load_chapters(chapters_path)
    train, held = split_chapters(chapters, spec.heldout_per_book)
    log(f"[tiny] training a {spec.vocab_size}-token BPE tokenizer on {spec.tokenizer_chars:,} chars of the novels")
    texts, n = [], 0
    for ch in train:
        if n >= spec.tokenizer_chars:
            break
        texts.append(ch["text"])
        n += len(ch["text"])
    tok = train_tokenizer(texts, spec.vocab_size, tmp)
    log(f"[tiny] tokenizing {len(train)} train / {len(held)} held-out chapters")
    train_ids = _token_stream(tok, train)
    held_ids = _token_stream(tok, held)
    cfg = tiny_config(len(tok), spec.arch, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                      spec.intermediate_size, spec.orig_ctx, spec.rope_theta, eos_token_id=tok.eos_token_id)
    model = random_model(cfg, spec.seed)
    held_windows = windows(held_ids, spec.orig_ctx, spec.heldout_windows, spec.seed)
    ppl_random = perplexity(model, held_windows)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"[tiny] pretraining {nparams / 1e6:.1f}M params for {spec.steps} steps x {spec.batch_size} x "
        f"{spec.orig_ctx} tokens on {len(train_ids):,} novel tokens (context {spec.orig_ctx})")
    hist = pretrain(model, train_ids, seq_len=spec.orig_ctx, batch_size=spec.batch_size, lr=spec.lr,
                    steps=spec.steps, seed=spec.seed, copy_prob=spec.copy_prob)
    ppl = perplexity(model, held_windows)
    log(f"[tiny] held-out perplexity: trained {ppl:.1f} vs random {ppl_random:.1f}")
    model.save_pretrained(tmp, safe_serialization=True)
    write_json_atomic(tmp / "tiny.json", {
        "spec": asdict(spec), "params": nparams, "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
        "heldout_chapters": [f"{c['book']}:{c['chapter']}" for c in held],
        "ppl_heldout": ppl, "ppl_heldout_random": ppl_random, "train_log": hist,
        "build_seconds": round(time.time() - t0, 1),
    })
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def ensure_tiny(spec: TinySpec = DEFAULT_SPEC, cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """The tiny default's model dir, built on first use (a few minutes) and reused afterwards."""
    d = tiny_dir(spec, cache_dir)
    if (d / "tiny.json").is_file():
        return d
    log = log or (lambda m: print(m, file=sys.stderr))
    log(f"[tiny] building the embedded tiny default into {d} (once; cached afterwards)")
    return build_tiny(spec, d, log=log)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_dir(path: str | os.PathLike) -> Path:
    """``path`` if it is an HF model directory with a config and weights; otherwise an InputError that says what
    the directory is instead (a finetune run to merge first, a folder without weights, not a folder)."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such model directory", p)
    if not p.is_dir():
        raise InputError("not a model directory (a file; pass the folder holding config.json)", p)
    run_json = p / "run.json"
    if run_json.is_file() or (p / "export.json").is_file() or (p / "final" / "export.json").is_file():
        kind = ""
        with contextlib.suppress(Exception):
            kind = json.loads(run_json.read_text(encoding="utf-8")).get("kind", "")
        if kind in ("", "finetune"):
            raise InputError("a finetune run directory, not a model: merge it first "
                             f"(python finetune.py merge --run {p} --out MODEL_DIR) and pass MODEL_DIR", p)
        raise InputError(f"a {kind} run directory, not a model directory", p)
    if not (p / "config.json").is_file():
        raise InputError("not a model directory (no config.json)", p)
    if not any((p / w).is_file() for w in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        raise InputError(f"model directory without weights (none of {', '.join(WEIGHT_FILES)})", p)
    return p


def resolve_model(name_or_path: str | os.PathLike | None) -> Path:
    """``tiny``/None -> the cached tiny default (built if missing); an existing path -> that HF model directory
    (checked: config + weights); a name shaped like a hub id (``Qwen/Qwen1.5-7B``) that is not a local path ->
    passed to transformers as it is (HF's own cache and offline variables apply)."""
    if name_or_path is None or str(name_or_path) in TINY_NAMES:
        return ensure_tiny()
    p = Path(name_or_path)
    if not p.exists() and _HUB_ID.match(str(name_or_path)):
        return p
    return check_model_dir(p)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ropescale make-tiny",
                                 description="Build (or show) the embedded tiny default model.")
    ap.add_argument("--out", help="model dir (default: the cache folder every CLI uses)")
    ap.add_argument("--steps", type=int, default=DEFAULT_SPEC.steps,
                    help="pretraining steps (changing it builds a different cached model)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args(argv)
    spec = TinySpec(steps=args.steps) if args.steps != DEFAULT_SPEC.steps else DEFAULT_SPEC
    d = Path(args.out) if args.out else tiny_dir(spec)
    if args.force or not (d / "tiny.json").is_file():
        # stdout carries only the JSON result: libraries imported during the build (DeepSpeed's accelerator
        # probe, via transformers) log to stdout
        with contextlib.redirect_stdout(sys.stderr):
            build_tiny(spec, d, log=lambda m: print(m, file=sys.stderr))
    info = json.loads((d / "tiny.json").read_text())
    print(json.dumps({"model": str(d), "params": info["params"], "ppl_heldout": round(info["ppl_heldout"], 2),
                      "ppl_heldout_random": round(info["ppl_heldout_random"], 2)}, ensure_ascii=False))
    return 0
