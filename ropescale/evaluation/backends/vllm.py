"""The ``vllm`` generation backend: vLLM offline inference, GPU only (the package doc says what every backend
shares).

vllm backend: imported lazily (``pip install vllm`` on a CUDA machine); ``max_model_len`` is twice the subset's
target length (not in the paper: the official release's Inference.py sets ``default_max_len`` = 32K / 64K / 128K /
256K for L / XL / 2XL / 3XL and builds one vLLM with the largest of the subsets run; here, per run, the run's
subset), raised if needed so the longest prompt + generation fits; the RoPE setting is
passed as ``hf_overrides`` (the config fields :func:`rope_scaling.apply_rope` wrote: ``rope_scaling.load``), plus what
:func:`vllm_settings` adds so that vLLM's precomputed rotary cache covers ``max_model_len`` and YaRN's attention
factor reaches it; settings vLLM would compute differently from transformers are refused there (dynamic NTK, dynamic
YaRN, YaRN past its rotary cache, LongRoPE samples on both sides of the original context, LongRoPE past it on vLLM
before 0.11.1), pointing to ``--backend hf``.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from rope_scaling.formulas import REGISTRY, VllmJob
from rope_scaling.hf import rope_entries, rope_state
from ropescale.common.cli import TORCH_NAMES, dtype_name
from ropescale.common.io import InputError

from ..engine import cut_at_eos
from .base import Backend, BackendJob, Item, OnDone, eos_ids_of


class VLLMBackend(Backend):
    """vLLM offline inference (GPU only; imported lazily). ``hf_overrides`` and ``max_model_len`` come from
    :func:`vllm_settings` (see there for what vLLM's rotary cache needs)."""

    name = "vllm"
    help = "GPU, imported only then"

    @classmethod
    def plan(cls, job: BackendJob):
        cfg, need = job.cfg, int(job.need_len)
        ov, mml = vllm_settings(cfg.config, cfg.rope_fields(), need=need, want=int(job.max_model_len or need),
                                state=cfg.state, short=job.short_len, vllm=vllm_version())

        def build():
            return cls(cfg.path, cfg.config, job.tokenizer, hf_overrides=ov, max_model_len=mml,
                       dtype=job.settings.dtype, log=job.log)

        return ("vllm", str(cfg.path), job.settings, repr(sorted(ov.items())), mml), build

    def __init__(self, model_dir, config, tokenizer, *, hf_overrides: dict, max_model_len: int,
                 dtype: str = "auto", gpu_memory_utilization: float = 0.9, chunk: int = 64, log=None, **_ignored):
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise InputError("the vllm backend needs the vllm package (pip install vllm, on a CUDA machine); "
                             "use --backend hf otherwise") from None
        import torch

        if not torch.cuda.is_available():
            raise InputError("the vllm backend needs a CUDA GPU (torch sees none); use --backend hf")
        from vllm import LLM

        self.log = log or (lambda m: print(m, file=sys.stderr))
        self.tokenizer = tokenizer
        self.eos = eos_ids_of(model_dir, config, tokenizer)
        self.max_model_len = int(max_model_len)
        self.overrides = dict(hf_overrides)
        # vllm_settings made the rotary cache cover max_model_len; vLLM's own length check reads more config keys
        # than the rotary cache (seq_length, model_max_length, ...), so it is skipped. (The variable alone would not
        # do: it skips the check, and positions past the cache then read garbage.)
        os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        self.chunk = chunk
        self.dtype = "bfloat16" if dtype == "auto" else TORCH_NAMES[dtype_name(dtype)]
        self.llm = LLM(model=str(model_dir), tokenizer=str(model_dir), dtype=self.dtype,
                       max_model_len=self.max_model_len, hf_overrides=self.overrides or None,
                       gpu_memory_utilization=gpu_memory_utilization, seed=0)

    def describe(self) -> dict:
        import importlib.metadata as md

        return {"backend": "vllm", "vllm": md.version("vllm"), "max_model_len": self.max_model_len,
                "hf_overrides": self.overrides, "dtype": self.dtype}

    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, min_tokens=min(min_new_tokens, max_new_tokens),
                            stop_token_ids=self.eos, skip_special_tokens=True)
        eos = set(self.eos)
        order = sorted(items, key=lambda it: -len(it.input_ids))
        for s in range(0, len(order), self.chunk):  # chunks, so results are saved as they come
            part = order[s:s + self.chunk]
            outs = self.llm.generate([{"prompt_token_ids": it.input_ids} for it in part], sp, use_tqdm=False)
            for it, o in zip(part, outs):
                on_done(it, cut_at_eos(o.outputs[0].token_ids, eos))


# ---------------------------------------------------------------- what vLLM is told
def vllm_version() -> str | None:
    """The installed vLLM release, or None."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def vllm_settings(config, overrides: dict, *, need: int, want: int, state=None, short: int | None = None,
                  vllm: str | None = None) -> tuple[dict, int]:
    """(hf_overrides, max_model_len) for vLLM, or an InputError where vLLM would compute something else than HF.

    ``config`` is the effective HF config (RoPE applied), ``overrides`` the fields the RoPE flags changed, ``need``
    the longest prompt + max new tokens (``short``: the shortest; default ``need``), ``want`` the max_model_len
    asked for (2x the subset's target, as the official release's Inference.py sizes it; the paper gives no
    max_model_len); ``state`` the config's ``rope_scaling.RopeState`` when the caller has read it
    (``rope_scaling.load.ModelConfig.state``); ``vllm`` the vLLM release that will serve (:func:`vllm_version`;
    None: not installed, the backend refuses then).

    vLLM precomputes a cos/sin cache at load time and indexes it by position; ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``
    only skips its length check, so a position past the cache reads garbage. Its length (vLLM source,
    ``model_executor/layers/rotary_embedding``) is ``max_position_embeddings`` for default (plain, ntk, abf) and
    llama3 rope, ``max_position_embeddings x factor`` for linear (pi) and dynamic,
    ``original_max_position_embeddings x factor`` for yarn. What each method needs, or why vLLM cannot serve it, is
    its registry row's vLLM rule (``rope_scaling.formulas.Method.vllm``: caches raised to cover max_model_len, YaRN
    capped to its cache with its attention factor in both spellings, LongRoPE on one side of the original context
    and past it only from vllm 0.11.1 on; dynamic NTK and dynamic YaRN refused); a method without one is refused.
    """
    cfg = config if isinstance(config, dict) else config.to_dict()
    key, e = rope_entries(cfg)  # the one reader of HF rope entries (4.x and 5.x layouts)
    st = state if state is not None else rope_state(cfg)  # the spec the config carries
    rule = REGISTRY[st.spec.method].vllm
    if rule is None:
        raise InputError(f"--backend vllm: rope {st.spec.label()} is not served by vLLM here; use --backend hf")
    return rule(VllmJob(cfg, key, e, st, dict(overrides), int(need), int(need if short is None else short),
                        max(int(want), int(need)), vllm))
