"""The embedded tiny default model: what ``--model tiny`` (the default of every CLI) resolves to.

A Qwen2-architecture model (Llama-style RoPE, RMSNorm, SwiGLU; 3.5M parameters, 4 layers) with a short original
context (512 tokens, rope_theta 10000) and a 2,048-token byte-level BPE tokenizer, both made here from the shared
novels, pretrained so that it *uses* its context: it copies passages it has seen and answers the recall task of
``ropescale.common.recall`` (write out the sentences marked 【1】..【K】 in the input) inside its 512 tokens. That is
what lets RoPE scaling show a real effect on a CPU: what a method does to positions past 512 changes what it can reach.

The build is deterministic for a :class:`TinySpec` on a given machine, torch version and thread count. The build of
the default spec is committed in ``assets/tiny/`` (its ``tiny.json`` holds the spec, the sha256 of the weights, the
build's metrics and log); every CLI uses it as it is. ``python -m ropescale make-tiny --build`` rebuilds it from
scratch (about an hour on 2 CPU cores) and says whether the weights came out bit-identical to the asset;
another spec (``--steps N``) is built into ``$ROPESCALE_CACHE/tiny-<hash>`` on first use.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ropescale.common import compat
from ropescale.common.io import InputError, read_json, sha256_file, write_json_atomic
from ropescale.common.paths import CACHE_DIR, CHAPTERS_JSONL, REPO_ROOT

EOS = "<|endoftext|>"
TINY_NAMES = ("tiny", "")


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
ASSET_DIR = REPO_ROOT / "assets" / "tiny"  # the committed build of DEFAULT_SPEC
MODEL_FILE = "model.safetensors"


# ---------------------------------------------------------------- data
def load_chapters(path: str | os.PathLike = CHAPTERS_JSONL) -> list[dict]:
    """The shared novels, one chapter a row: {book, chapter, title, text} (read by ropescale.common.chapters)."""
    from ropescale.common.chapters import read_chapters

    return [{"book": c.book, "chapter": c.chapter, "title": c.title, "text": c.text} for c in read_chapters(path)]


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


# ---------------------------------------------------------------- the pretraining mixture
class Mixture:
    """The windows the tiny default is pretrained on, drawn with one seeded RNG.

    Phase 1 (the first ``short_steps`` steps): ``short_batch`` windows of ``short_len`` tokens: half are random
    token sequences of 4 to a quarter of the window (at most 64) tokens, each repeated 2-4 times (nothing but looking
    back predicts them), a quarter are novel passages repeated after a short gap, a quarter plain text. On short
    windows the induction heads (attend to the token after an earlier occurrence of the current one, copy it) form
    within a few hundred steps; on 512-token windows of text they did not form in 1,500 (measured while designing this
    build).

    Phase 2: ``batch_size`` windows of ``orig_ctx`` tokens:
    - **recall** (``p_task``): a recall sample (ropescale.common.recall: sentences marked 【k】, the marked sentences
      as the answer) of random length, rendered with an Appendix F.2 prompt (ft-ie or ft-ib) + answer + EOS, the rest
      of the window novel text: the task the demo measures, learned inside the original context;
    - **copy** (``p_copy``): novel passages of 20-150 tokens each repeated exactly after a gap of up to 120 tokens;
    - **synthetic** (``p_synth``): repeated random-token sequences, as in phase 1;
    - otherwise plain novel text.
    """

    def __init__(self, spec: TinySpec, tok, train_ids: Sequence[int], sources, seed: int):
        self.spec, self.tok, self.ids, self.sources = spec, tok, train_ids, sources
        self.rng = random.Random(seed)
        self.eos = tok.eos_token_id
        self.vocab = len(tok)

    def text(self, n: int) -> list[int]:
        if n <= 0:
            return []
        s = self.rng.randrange(len(self.ids) - n - 1)
        return list(self.ids[s:s + n])

    def synthetic(self, n: int) -> list[int]:
        w: list[int] = []
        while len(w) < n:
            r = [self.rng.randrange(1, self.vocab) for _ in range(self.rng.randint(4, max(4, min(64, n // 4))))]
            w += r * self.rng.randint(2, 4)
        return w[:n]

    def copy(self, n: int, longest: int = 150, gap: int = 120) -> list[int]:
        w: list[int] = []
        while len(w) < n:
            a = self.text(self.rng.randint(min(20, longest), longest))
            w += a + self.text(self.rng.randint(0, gap)) + a
        return w[:n]

    def recall(self, n: int) -> list[int]:
        from ropescale.common import prompts
        from ropescale.common.recall import build

        rng = self.rng
        hi = n - 150  # room for the prompt (~40 tokens) and the answer; shrunk when a sample does not fit
        for _ in range(200):
            src = self.sources[rng.randrange(len(self.sources))]
            ex = build(src, rng.randrange(len(src)), rng.randint(min(n // 4, hi), hi), rng)
            if ex is None:
                continue
            prompt = prompts.render(ex["context"], rng.choice(("ft-ie", "ft-ib")))
            ids = self.tok(prompt + ex["summary"], add_special_tokens=False)["input_ids"] + [self.eos]
            if len(ids) <= n:
                return ids + self.text(n - len(ids))
            hi = max(32, int(hi * 0.8))
        raise InputError(f"recall samples do not fit in {n}-token windows with this tokenizer")

    def short(self, n: int) -> list[int]:
        r = self.rng.random()
        if r < 0.5:
            return self.synthetic(n)
        if r < 0.75:
            return self.copy(n, longest=n // 3, gap=n // 4)
        return self.text(n)

    def window(self, n: int) -> list[int]:
        sp, r = self.spec, self.rng.random()
        if r < sp.p_synth:
            return self.synthetic(n)
        r = self.rng.random()
        if r < sp.p_task:
            return self.recall(n)
        if r < sp.p_task + sp.p_copy:
            return self.copy(n)
        return self.text(n)

    def batch(self, step: int) -> list[list[int]]:
        sp = self.spec
        if step < sp.short_steps:
            return [self.short(sp.short_len) for _ in range(sp.short_batch)]
        return [self.window(sp.orig_ctx) for _ in range(sp.batch_size)]


def pretrain(model, mixture: Mixture, *, lr: float, steps: int, warmup: int, seed: int, on_eval=None,
             eval_every: int = 0) -> list[dict]:
    """Next-token pretraining on ``mixture`` windows for a fixed number of steps (AdamW, linear warm-up, cosine
    decay to 10%). Deterministic for a seed and thread count on a given machine. Returns the log."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    hist: list[dict] = []
    t0 = time.time()
    ema = None
    for step in tqdm(range(steps), desc="pretrain tiny", unit="step", file=sys.stderr, leave=False):
        cur_lr = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x = torch.tensor(mixture.batch(step))
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
        if on_eval and eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            model.eval()
            hist.append({"step": step + 1, **on_eval(model)})
            model.train()
    model.eval()
    return hist


# ---------------------------------------------------------------- what the built model can do
def copy_effect(model, held_ids: Sequence[int], *, seq_len: int, span: int = 64, n: int = 16,
                seed: int = 0) -> dict:
    """Loss (nats/token) on a ``span``-token passage at the end of a held-out window, with the passage pasted
    earlier in the window (at least 128 tokens before it) vs the intact window: copying shows as a lower loss."""
    import torch

    rng = random.Random(seed)
    span, gap = min(span, seq_len // 4), min(128, seq_len // 4)
    with_copy, without = 0.0, 0.0
    with torch.no_grad():
        for w in windows(held_ids, seq_len, n, seed):
            dst = seq_len - span
            src = rng.randrange(0, dst - span - gap + 1)
            pasted = list(w)
            pasted[src:src + span] = w[dst:dst + span]
            for seq, acc in ((w, 0), (pasted, 1)):
                x = torch.tensor([seq])
                lg = model(input_ids=x).logits[0, dst - 1:seq_len - 1].float()
                loss = float(torch.nn.functional.cross_entropy(lg, x[0, dst:]))
                if acc:
                    with_copy += loss / n
                else:
                    without += loss / n
    return {"copy_loss": round(with_copy, 4), "nocopy_loss": round(without, 4)}


def recall_score(model, tok, samples: Sequence[dict], prompt: str = "ft-ie", max_new_tokens: int = 160) -> float:
    """Mean CNNSum ROUGE-L (x100) of greedy answers to recall samples (ropescale.common.recall) with an F.2 prompt."""
    import torch

    from ropescale.common import prompts
    from ropescale.common.rouge import cnnsum_rouge_l

    scores = []
    with torch.no_grad():
        for ex in samples:
            ids = tok(prompts.render(ex["context"], prompt), add_special_tokens=False)["input_ids"]
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
            pred = tok.decode(out[0, len(ids):], skip_special_tokens=True)
            scores.append(100 * cnnsum_rouge_l(pred, ex["summary"]))
    return round(sum(scores) / max(len(scores), 1), 2)


# ---------------------------------------------------------------- build + cache
def tiny_dir(spec: TinySpec = DEFAULT_SPEC, cache_dir: str | os.PathLike | None = None) -> Path:
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
               chapters_path: str | os.PathLike = CHAPTERS_JSONL, log=print, eval_every: int = 0) -> Path:
    """Build the tiny default into ``out_dir`` (atomically: built in a temp folder, then renamed). Deterministic
    for a spec on a given machine and torch version: ``spec.threads`` fixes the CPU thread count."""
    import torch

    from ropescale.common.chapters import read_chapters
    from ropescale.common.io import atomic_dir
    from ropescale.common.recall import sources, split_part

    out = Path(out_dir) if out_dir else tiny_dir(spec)
    t0 = time.time()
    with _threads(spec.threads), atomic_dir(out) as tmp:
        torch.manual_seed(spec.seed)
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
        # the prompts and marks of the recall task, so their tokens exist (a few hundred of them)
        from ropescale.common import prompts
        from ropescale.common.recall import mark

        texts.append("\n".join(prompts.render(mark(k) + "。", p) for k in range(1, 10) for p in ("ft-ie", "ft-ib"))
                     * 20)
        tok = train_tokenizer(texts, spec.vocab_size, tmp)
        log(f"[tiny] tokenizing {len(train)} train / {len(held)} held-out chapters")
        train_ids = _token_stream(tok, train)
        held_ids = _token_stream(tok, held)
        train_sources = sources(train_chs, tok)
        cfg = tiny_config(len(tok), spec.arch, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                          spec.intermediate_size, spec.orig_ctx, spec.rope_theta, eos_token_id=tok.eos_token_id)
        model = random_model(cfg, spec.seed)
        held_windows = windows(held_ids, spec.orig_ctx, spec.heldout_windows, spec.seed)
        ppl_random = perplexity(model, held_windows)
        nparams = sum(p.numel() for p in model.parameters())
        log(f"[tiny] pretraining {nparams / 1e6:.1f}M params for {spec.steps} steps x {spec.batch_size} x "
            f"{spec.orig_ctx} tokens on {len(train_ids):,} novel tokens (context {spec.orig_ctx})")
        mixture = Mixture(spec, tok, train_ids, train_sources, spec.seed)
        probe = lambda m: copy_effect(m, held_ids, seq_len=spec.orig_ctx, n=4)  # noqa: E731
        hist = pretrain(model, mixture, lr=spec.lr, steps=spec.steps,
                        warmup=spec.warmup, seed=spec.seed, on_eval=probe, eval_every=eval_every)
        ppl = perplexity(model, held_windows)
        ce = copy_effect(model, held_ids, seq_len=spec.orig_ctx)
        from ropescale.common.recall import recall_samples

        held_src = sources(held_chs, tok)
        rec = recall_samples(held_src, tok, n=12, target=spec.orig_ctx - 160, seed=spec.seed)  # + answer: 512
        rs = {p: recall_score(model, tok, rec, p) for p in ("ft-ie", "ft-ib")}
        log(f"[tiny] held-out perplexity: trained {ppl:.1f} vs random {ppl_random:.1f}; copy loss "
            f"{ce['copy_loss']:.2f} vs {ce['nocopy_loss']:.2f} without the copy; recall ROUGE-L {rs}")
        model.generation_config.pad_token_id = tok.eos_token_id
        model.save_pretrained(tmp, safe_serialization=True)
        import transformers

        write_json_atomic(tmp / "tiny.json", {
            "spec": asdict(spec), "key": spec.key(), "sha256": {MODEL_FILE: sha256_file(tmp / MODEL_FILE)},
            "params": nparams, "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
            "heldout_chapters": [f"{c.book}:{c.chapter}" for c in held_chs],
            "ppl_heldout": ppl, "ppl_heldout_random": ppl_random, **ce, "recall_rouge_l": rs,
            "train_log": hist, "build_seconds": round(time.time() - t0, 1),
            "built_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "threads": spec.threads, "python": sys.version.split()[0]},
        })
    return out


def asset_info(d: Path = ASSET_DIR) -> dict | None:
    """The committed build's tiny.json, or None when there is none."""
    p = Path(d) / "tiny.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


_VERIFIED: set[str] = set()


def verified_asset(spec: TinySpec = DEFAULT_SPEC) -> Path | None:
    """The committed asset dir when it is a build of ``spec`` (checked once per process against its sha256)."""
    info = asset_info()
    if not info or info.get("key") != spec.key():
        return None
    key = str(ASSET_DIR)
    if key not in _VERIFIED:
        want = info["sha256"][MODEL_FILE]
        got = sha256_file(ASSET_DIR / MODEL_FILE)
        if got != want:
            raise InputError(f"{MODEL_FILE} does not match the sha256 in tiny.json ({got[:12]} vs {want[:12]}); "
                             f"restore it (git checkout assets/tiny) or rebuild: python -m ropescale make-tiny "
                             f"--build --update-asset", ASSET_DIR)
        _VERIFIED.add(key)
    return ASSET_DIR


def ensure_tiny(spec: TinySpec = DEFAULT_SPEC, cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """The tiny default's model dir: the committed asset (``assets/tiny``) for the default spec, otherwise a
    cached build (made on first use and reused afterwards)."""
    asset = verified_asset(spec) if cache_dir is None else None
    if asset is not None:
        return asset
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
    check_weights(p)
    return p


def check_weights(p: Path) -> None:
    """The weights of model directory ``p`` are there and whole: some weight file exists, every shard an index
    names exists, and every safetensors file has a readable header and at least the bytes that header promises
    (a copy cut short is one line here, not a traceback from the loader). Reads headers only, never the tensors."""
    if not any((p / w).is_file() for w in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        raise InputError(f"model directory without weights (none of {', '.join(WEIGHT_FILES)})", p)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        wmap = read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wmap, dict):
            raise InputError("safetensors index without a weight_map", index)
        missing = sorted({s for s in wmap.values() if not (p / str(s)).is_file()})
        if missing:
            raise InputError(f"missing weight shard(s) the index names: {', '.join(missing)}", index)
    for f in sorted(p.glob("*.safetensors")):
        _check_safetensors(f)


def _check_safetensors(f: Path) -> None:
    """safetensors layout: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
    data_offsets: [begin, end]}, optional __metadata__}), then the data; offsets are relative to the data start."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise InputError(f"not a whole safetensors file ({size} bytes; its header cannot be read): a truncated "
                             "or interrupted copy?", f)
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("not a safetensors file (its header is not JSON)", f) from None
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise InputError(f"truncated safetensors file: {size} of the {need} bytes its header describes (an "
                         "interrupted download or copy?)", f)


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
