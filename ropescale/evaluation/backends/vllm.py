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

import math
import os
import re
import sys
from typing import Any, NamedTuple, Sequence

from rope_scaling.formulas import REGISTRY, yarn_attention_factor
from rope_scaling.hf import rope_entries, rope_state
from ropescale.common.cli import TORCH_NAMES, dtype_name
from ropescale.common.compat import rope_layer_types
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
        if "dual_chunk_attention_config" in self.overrides:  # vLLM's DCA runs on its own attention backend
            os.environ.setdefault("VLLM_ATTENTION_BACKEND", "DUAL_CHUNK_FLASH_ATTN")
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


# ---------------------------------------------------------------- attention-level methods
DCA_MODEL_TYPES = ("qwen2", "qwen2_moe")  # the vLLM models that read dual_chunk_attention_config (Qwen2.5-1M's)


def vllm_dca(cfg: dict) -> bool:
    """Whether the installed vLLM serves Dual Chunk Attention for this config: its ``DualChunkRotaryEmbedding``
    imports and the model type reads ``dual_chunk_attention_config`` (:data:`DCA_MODEL_TYPES`)."""
    if cfg.get("model_type") not in DCA_MODEL_TYPES:
        return False
    try:
        from vllm.model_executor.layers.rotary_embedding import DualChunkRotaryEmbedding  # noqa: F401
    except Exception:
        return False
    return True


def attention_settings(cfg: dict, st, overrides: dict, need: int, want: int, dca: bool) -> tuple[dict, int]:
    """hf_overrides for an attention-level method: DCA as ``dual_chunk_attention_config`` (chunk_size, local_size,
    original_max_position_embeddings; vLLM's DualChunkRotaryEmbedding computes ChunkLlama's positions) on plain RoPE
    where ``dca``; Self-Extend, and DCA elsewhere, refused in one line naming --backend hf."""
    from ropescale.common.attention_extend import dca_sizes

    sp = st.spec
    if sp.attention_extend == "self_extend":
        raise InputError("--backend vllm cannot run Self-Extend (--attention-extend self_extend): vLLM has no grouped "
                         "attention; use --backend hf")
    if not dca:
        raise InputError(f"--backend vllm: the installed vLLM does not serve dual_chunk_attention_config for model "
                         f"type {cfg.get('model_type')!r} (vLLM's DCA: {', '.join(DCA_MODEL_TYPES)}); use --backend hf")
    if sp.scaled:
        raise InputError(f"--backend vllm: vLLM's DCA replaces the model's rotary embedding, so "
                         f"{sp.rope_only().label()} under it would be dropped; use --backend hf")
    c, w = dca_sizes(sp.dca_chunk_size, sp.dca_local_size, st.orig_ctx)
    out = {**overrides, "dual_chunk_attention_config": {"chunk_size": c, "local_size": w,
                                                        "original_max_position_embeddings": st.orig_ctx}}
    mml = max(int(want), int(need))
    if int(cfg.get("max_position_embeddings") or 0) < mml:
        out["max_position_embeddings"] = mml  # the key-position table covers max_position_embeddings
    return out, mml


# ---------------------------------------------------------------- what vLLM is told
def vllm_version() -> str | None:
    """The installed vLLM release, or None."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def vllm_settings(config, overrides: dict, *, need: int, want: int, state=None, short: int | None = None,
                  vllm: str | None = None, dca: bool | None = None) -> tuple[dict, int]:
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
    ``original_max_position_embeddings x factor`` for yarn. An attention-level method (``--attention-extend``) goes
    to :func:`attention_settings` (DCA as vLLM's ``dual_chunk_attention_config`` where it is supported: ``dca``,
    default :func:`vllm_dca`). What each method needs, or why vLLM cannot serve it, is
    the rule of the HF rope type its registry row writes (:data:`RULES`: caches raised to cover max_model_len, YaRN
    capped to its cache with its attention factor in both spellings, LongRoPE on one side of the original context
    and past it only from vllm 0.11.1 on); a type without one is refused, and so is a row whose frequencies this
    repo recomputes per forward (``Method.per_forward``: dynamic YaRN) or follow the length where vLLM's rope of
    that type does not (``Method.by_length`` outside :data:`BY_LENGTH`: dynamic NTK).
    """
    cfg = config if isinstance(config, dict) else config.to_dict()
    key, e = rope_entries(cfg)  # the one reader of HF rope entries (4.x and 5.x layouts)
    st = state if state is not None else rope_state(cfg)  # the spec the config carries
    if st.spec.attention_extend != "none":  # an attention-level method: vLLM's own DCA, or refused
        return attention_settings(cfg, st, dict(overrides), need, want, vllm_dca(cfg) if dca is None else dca)
    if rope_layer_types(cfg) and overrides:  # vLLM's per-layer rope follows its own model code, not these entries
        raise InputError(f"--backend vllm: the RoPE flags rewrote a per-layer-type rope_parameters "
                         f"({', '.join(rope_layer_types(cfg))}), which vLLM is not told reliably; use --backend hf")
    method, t = REGISTRY[st.spec.method], e["rope_type"]
    if method.per_forward:  # the entries say a static type; this repo recomputes the frequencies per forward
        raise InputError(f"--backend vllm cannot run {st.spec.method}: the config's entries say static {t} "
                         f"x{st.spec.scale:g}, which vLLM would serve at every length (this repo recomputes the "
                         f"frequencies from the current length); use --backend hf")
    if method.by_length and t not in BY_LENGTH:  # transformers follows the length, vLLM's rope of that name does not
        raise InputError(f"--backend vllm cannot run {st.spec.label()} ({t!r} entries): transformers computes them "
                         f"from the current length, vLLM's {t!r} rope is "
                         f"{STATIC.get(t, 'one set of frequencies for every length')}; use --backend hf")
    if t not in RULES:
        raise InputError(f"--backend vllm: rope {st.spec.label()} is not served by vLLM here; use --backend hf")
    return RULES[t](VllmJob(cfg, key, e, st, dict(overrides), int(need), int(need if short is None else short),
                            max(int(want), int(need)), vllm))


# ---------------------------------------------------------------- how vLLM serves each HF rope type, or refuses it
class VllmJob(NamedTuple):
    """What a rope type's vLLM rule reads (built by :func:`vllm_settings`)."""

    cfg: dict  # the effective HF config as a dict (the RoPE flags applied)
    key: str  # where its rope entries live: rope_parameters (transformers 5.x) or rope_scaling (4.x)
    entries: dict  # those entries, flat 5.x-style (rope_type, rope_theta, the type's keys)
    state: Any  # the config's rope_scaling.hf.RopeState
    overrides: dict  # hf_overrides so far: the config fields the RoPE flags changed
    need: int  # the longest prompt + max new tokens
    short: int  # the shortest prompt + max new tokens
    mml: int  # the max_model_len asked for (at least ``need``)
    vllm: str | None  # the installed vLLM release (None: not installed; the backend refuses then)


def _vllm_entries(job: VllmJob, **changes) -> dict:
    """The job's rope dict with ``changes``, in the config's layout (4.x keeps rope_theta beside rope_scaling)."""
    rope = {**job.entries, **changes}
    if job.key == "rope_scaling":
        rope.pop("rope_theta", None)
        rope.setdefault("type", job.entries["rope_type"])
    return rope


def _vllm_with(job: VllmJob, rope: dict) -> dict:
    """The job's overrides plus ``rope`` under its key, unless the config already holds exactly that."""
    return job.overrides if rope == job.cfg.get(job.key) else {**job.overrides, job.key: rope}


def _vllm_cached(job: VllmJob, factor: float = 1.0) -> tuple[dict, int]:
    """default (none, ntk, abf), linear (pi, cache x factor) and llama3 entries: vLLM's rotary cache holds
    max_position_embeddings x ``factor`` positions and the frequencies do not depend on it, so it is raised through
    hf_overrides until the cache covers max_model_len (llama3: vLLM's llama3 rope computes transformers' formula)."""
    out = dict(job.overrides)
    if int(job.cfg.get("max_position_embeddings") or 0) * factor < job.mml:
        out["max_position_embeddings"] = int(math.ceil(job.mml / factor))
    return out, job.mml


def _vllm_linear(job: VllmJob) -> tuple[dict, int]:
    return _vllm_cached(job, float(job.entries.get("factor") or 1.0))


def _vllm_yarn(job: VllmJob) -> tuple[dict, int]:
    """vLLM's YaRN cache holds original_max_position_embeddings x factor positions and cannot be moved without
    changing the frequencies in some releases: prompt + new tokens beyond it are refused, max_model_len is capped to
    it. The attention factor goes both as HF's ``attention_factor`` (recent vLLM) and as vLLM's ``attn_factor``
    multiplier of 0.1 ln(s) + 1 (older vLLM reads only that), so vLLM scales cos/sin exactly as transformers does."""
    e, cfg = job.entries, job.cfg
    factor = float(e["factor"])
    orig = int(e.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
               or cfg.get("max_position_embeddings") or 0)
    cache = int(math.ceil(orig * factor))
    if job.need > cache:
        raise InputError(f"--backend vllm: prompt + new tokens reach {job.need} tokens, past vLLM's YaRN rotary cache "
                         f"of {cache} positions (original_max_position_embeddings {orig} x factor {factor:g}), where "
                         f"it would read garbage; use --backend hf, or a larger --scale")
    if e.get("truncate") is False and job.vllm is not None and not at_least(job.vllm, YARN_TRUNCATE):
        raise InputError(f"--backend vllm: vLLM {job.vllm} rounds YaRN's ramp ends (it reads 'truncate: false' from "
                         f"vllm {'.'.join(map(str, YARN_TRUNCATE))} on, with gpt-oss); use --backend hf")
    af = job.state.frequencies().attention_factor  # this registry's formula: what transformers multiplies cos/sin by
    rope = _vllm_entries(job, attention_factor=af, attn_factor=af / yarn_attention_factor(job.state.spec.scale))
    return _vllm_with(job, rope), min(job.mml, cache)


# vLLM's YaRN reads ``truncate`` (exact ramp ends) from the release that added gpt-oss (0.10.1); DeepSeek's mscale /
# mscale_all_dim need nothing more: the factor they give reaches it as attention_factor / attn_factor above
YARN_TRUNCATE = (0, 10, 1)


# vLLM picks LongRoPE's factor set once, from max_model_len, from 0.11.1 on (vllm-project/vllm#27431, fixing #27414:
# phi3_long_rope_scaled_rope.py sets use_long_rope = max_model_len > original_max_position_embeddings at init).
# Up to 0.11.0 its forward took the long set for a whole batch as soon as any position in it passed the original
# context (torch.any(positions > k)): a prompt within the window is prefilled with the short set and decoded past it
# with the long one, against a cache built with the short one.
LONGROPE_FIXED = (0, 11, 1)


def at_least(version: str | None, release: tuple[int, int, int]) -> bool:
    """Whether vLLM release ``version`` (``0.11.1``, ``0.12.0+cu129``, ``0.11.1rc2``) is ``release`` or later; a
    pre-release or dev build of that release itself counts as before it (None, unreadable: False)."""
    m = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)", str(version or ""))
    if not m:
        return False
    found = tuple(int(x or 0) for x in m.groups()[:3])
    final = not re.match(r"[.-]?(a|b|rc|c|alpha|beta|pre|preview|dev)", m.group(4).split("+")[0].lower())
    return found > release or (found == release and final)


def longrope_fixed(version: str) -> bool:
    """Whether vLLM release ``version`` keeps one LongRoPE factor set per run (:data:`LONGROPE_FIXED`)."""
    return at_least(version, LONGROPE_FIXED)


def _vllm_longrope(job: VllmJob) -> tuple[dict, int]:
    """vLLM (``Phi3LongRoPEScaledRotaryEmbedding``) reads the attention factor only as ``short_mscale`` /
    ``long_mscale`` (else it derives it from max_position_embeddings / orig, which the overrides may raise) and caches
    max_position_embeddings long positions; the hf backend picks a set per sample (prompt + max new tokens past orig:
    long). Served when all samples are on one side of orig: all within it (max_model_len capped to orig: no position
    passes it, so every vLLM release keeps the short set), or all past it on vLLM >= 0.11.1 (the long set for the
    run; max_position_embeddings raised to max_model_len); refused otherwise."""
    cfg, e, mml = job.cfg, job.entries, job.mml
    orig = int(e.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
               or cfg.get("max_position_embeddings"))
    out = dict(job.overrides)
    if job.need <= orig:  # every sample short: keep vLLM on the short factors
        mml = min(mml, orig)
    elif job.short <= orig:
        raise InputError(f"--backend vllm: with longrope the hf backend gives each sample its own factor set (long "
                         f"when prompt + max new tokens > {orig}), vLLM one set for all; these samples reach "
                         f"{job.short} to {job.need} tokens, on both sides: split the eval set by length, or use "
                         f"--backend hf")
    elif job.vllm is not None and not longrope_fixed(job.vllm):
        fixed = ".".join(map(str, LONGROPE_FIXED))
        raise InputError(f"--backend vllm: vLLM {job.vllm} switches LongRoPE's factors within a sample (the long set "
                         f"once a batch passes {orig} tokens, over a cache built with the short one); LongRoPE past "
                         f"the original context needs vllm>={fixed}; use --backend hf")
    elif int(cfg.get("max_position_embeddings") or 0) < mml:
        out["max_position_embeddings"] = mml  # vLLM's long cos/sin cache has max_position_embeddings positions
    af = job.state.frequencies().attention_factor  # this registry's formula = transformers' attention_factor
    return _vllm_with(job._replace(overrides=out), _vllm_entries(job, short_mscale=af, long_mscale=af)), mml




# the rule of each HF rope type a registry row writes (rope_scaling.formulas: Method.hf); a type without one is refused
RULES = {"default": _vllm_cached, "linear": _vllm_linear, "llama3": _vllm_cached, "yarn": _vllm_yarn,
         "longrope": _vllm_longrope}
# the HF types of rows whose frequencies follow the length (Method.by_length) that vLLM serves: its rule picks one
# set for the run and refuses what would need another; every other by_length row is refused
BY_LENGTH = ("longrope",)
# what vLLM computes for such a type (the reason a refusal gives)
STATIC = {"dynamic": "a static NTK base for the full factor"}
