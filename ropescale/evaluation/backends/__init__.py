"""Generation backends for ``eval_summ generate``: ``hf`` (transformers, CPU or GPU) and ``vllm`` (GPU only).

Both take token ids (tokenized once by :mod:`ropescale.evaluation.generate`, so ``input_tokens`` means the same thing
for both) and return, per sample, the greedy continuation's token ids cut at the first EOS. Settings are the paper's
(Sec 4.2 / Appendix B.1): greedy decoding, at least ``min_new_tokens`` (10) new tokens, at most ``max_new_tokens``.

One concern a file: the interface every backend implements (``base.py``: :class:`~.base.Backend`, the job it is
asked to serve, the prepared samples), one module per backend (``hf.py``, ``vllm.py``), and here the registry
(:data:`BACKENDS`), the settings (:class:`BackendSettings`) and :func:`make_backend`. A new backend is one module
with one :class:`~.base.Backend` subclass and one name in :data:`BACKENDS` (docs/extending.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from ropescale.common.cli import DTYPES, dtype_name
from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .base import Backend, BackendJob, Item
from .hf import CACHES, HFBackend
from .vllm import VLLMBackend

__all__ = ["BACKENDS", "Backend", "BackendJob", "BackendSettings", "Item", "make_backend"]

BACKENDS: dict[str, type[Backend]] = {c.name: c for c in (HFBackend, VLLMBackend)}  # --backend NAME -> its class
GROUP = "advanced: backend (how predictions are computed; never part of what a resumed run must match)"


class _Names:
    """The names of a registry, read when asked: a backend registered later is a choice too."""

    def __init__(self, registry: dict):
        self.registry = registry

    def __iter__(self):
        return iter(self.registry)

    def __contains__(self, name) -> bool:
        return name in self.registry

    def __len__(self) -> int:
        return len(self.registry)


@dataclass(frozen=True)
class BackendSettings:
    """How generation runs (nested in ``ropescale.evaluation.generate.GenerateSettings``; the same flags on
    generate/run)."""

    backend: str = setting("hf", "; ".join(f"{n}: {c.help}" for n, c in BACKENDS.items()), choices=_Names(BACKENDS),
                           group=GROUP)
    device: str = setting("auto", "hf backend: auto, cpu or cuda[:N]", group=GROUP)
    dtype: str = setting("auto", "weights' dtype; auto: fp32 on CPU, bf16 on GPU", parse=dtype_name, choices=DTYPES,
                         group=GROUP)
    batch_tokens: int | None = setting(None, "hf backend: token budget of a batch, i.e. slots x (longest prompt + 2 x "
                                             "max new tokens) with --cache slots; default: 32K tokens or 512 MiB "
                                             "of KV cache on CPU with slots, else 8K; from free memory on GPU",
                                       check=(lambda v: v >= 1, ">= 1"), group=GROUP)
    max_batch: int = setting(64, "hf backend: most samples per batch", check=(lambda v: v >= 1, ">= 1"), group=GROUP)
    cache: str = setting("slots", "hf backend decoder: slots (ropescale's slot decoder: per-sample prefill, "
                                  "continuous batching, a CUDA-graph decode step on GPU; needs transformers 5.x + "
                                  "SDPA, else falls back to static), or transformers generate on length-sorted "
                                  "padded batches with a static (written in place) or dynamic (concatenated every "
                                  "step) KV cache", choices=CACHES, group=GROUP)
    compile: bool = setting(False, "hf backend, --cache static: let transformers compile the decode step (CUDA)",
                            group=GROUP)
    cuda_graph: bool = setting(True, "hf backend, --cache slots: capture the decode step as a CUDA graph (false: "
                                     "eager steps, for debugging)", negative="--no-cuda-graph", group=GROUP)


def make_backend(settings: BackendSettings, cfg, tokenizer, *, model=None, max_model_len: int | None = None,
                 need_len: int | None = None, short_len: int | None = None, log=None,
                 reuse: dict | None = None) -> Backend:
    """The backend ``settings`` ask for, for ``cfg`` (a ``rope_scaling.load.ModelConfig``: the model's config with
    the RoPE flags applied, read once); ``max_model_len`` / ``need_len`` / ``short_len`` matter to vllm only;
    ``model``: a loaded
    model for hf. ``reuse`` (a dict the caller keeps across calls) returns the backend an earlier call built when
    the settings are the same; a different one is dropped first (GPU memory)."""
    if settings.backend not in BACKENDS:
        raise InputError(f"unknown backend {settings.backend!r} (choose from {', '.join(BACKENDS)})")
    job = BackendJob(settings, cfg, tokenizer, model=model, max_model_len=max_model_len, need_len=need_len,
                     short_len=short_len, log=log)
    key, build = BACKENDS[settings.backend].plan(job)
    if reuse is None:
        return build()
    if key in reuse:
        return reuse[key]
    if reuse:
        import gc

        reuse.clear()
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
    reuse[key] = be = build()
    return be
