"""Generation backends for ``eval_summ generate``: ``hf`` (transformers, CPU or GPU) and ``vllm`` (GPU only).

Both take token ids (tokenized once by :mod:`ropescale.evaluation.generate`, so ``input_tokens`` means the same thing
for both) and return, per sample, the greedy continuation's token ids cut at the first EOS. Settings are the paper's
(Sec 4.2 / Appendix B.1): greedy decoding, at least ``min_new_tokens`` (10) new tokens, at most ``max_new_tokens``.

hf backend, ``cache="slots"`` (the default; :mod:`ropescale.evaluation.engine`): ropescale's own greedy loop over a
fixed slot cache — each sample prefilled alone (no padding, SDPA's causal flash path), continuous batching (a finished
slot is refilled from the length-sorted queue), and on CUDA a decode step captured once as a CUDA graph. The slot count
comes from a token budget: slots x (longest prompt + 2 x max new tokens) <= ``batch_tokens`` (default on CPU: 32K
tokens or 512 MiB of cache, whichever holds more, at most a quarter of the RAM; on CUDA what 90% of the free memory
holds after one prefill's activations). On an H100 with a 7B shape at 12-17K prompts this is 12.4x plain batch-1
``generate`` (README). It needs transformers 5.x and SDPA; otherwise the backend falls back to ``static`` with a note.

hf backend, ``cache="static"`` / ``"dynamic"``: transformers ``generate`` on length-sorted, left-padded batches
whose size is set by a token budget (batch x (longest input + max new tokens) <= budget; CUDA: 70% of the free
memory counting KV cache, prefill activations and the padding mask), with transformers' ``StaticCache`` (written
in place; ``compile=True`` lets transformers compile its decode step) or its dynamic cache (concatenated every
step). SDPA attention (FlashAttention-2 when ``flash_attn`` is importable, on CUDA, in half precision).

Every path: fp32 on CPU, bf16 on GPU; logits for the last position only during prefill, so a 16K prompt never
materialises 16K x vocab logits; on a CUDA out-of-memory error the slot count / batch is halved and the
unfinished samples retried.

Batching changes nothing but speed: greedy outputs equal those of plain batch-1 ``model.generate`` in fp32 (tested
token for token on tiny random Qwen2 / Llama models on CPU, for every cache; on CUDA by ``bench_generate.py --toy
--dtype float32``). In bf16 the attention kernels round differently (masked vs causal SDPA), and with flat
random-weight logits an argmax flips after a few tokens.

With dynamic NTK, transformers' rotary module keeps the largest base it has computed; every prefill (slots) or
batch (static / dynamic) starts from the original base again (:func:`ropescale.evaluation.engine.reset_dynamic_rope`),
and the slot decoder gives each slot its own frequencies, so each sample is decoded as batch-1 ``generate`` on a fresh
model decodes it. (A padded batch of ``generate`` still shares one base: the longest row's; so does dynamic YaRN's
length.) LongRoPE: each sample keeps one factor set from its prefill on, long when prompt + max new tokens passes the
original context (:mod:`ropescale.evaluation.engine`); padded batches never mix the two (:func:`longrope_groups`).

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

import dataclasses
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Hashable, Sequence

from ropescale.common import compat
from ropescale.common.cli import DTYPES, TORCH_NAMES, dtype_name, torch_dtype
from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .engine import cut_at_eos

CACHES = ("slots", "static", "dynamic")  # hf backend: our slot decoder, or transformers generate with that cache
CPU_SLOT_CACHE_BYTES = 512 * 2 ** 20  # slot decoder on CPU: the cache a default batch may fill (or 32K tokens)
GROUP = "advanced: backend (how predictions are computed; never part of what a resumed run must match)"


@dataclass
class Item:
    """One prepared sample: its id and the prompt's token ids."""

    id: object
    input_ids: list[int]
    extra: dict = field(default_factory=dict)


OnDone = Callable[[Item, list[int]], None]


@dataclass(frozen=True)
class BackendJob:
    """What a backend is asked to serve: its settings, the model's config read once (``rope_scaling.load.ModelConfig``:
    the RoPE flags applied), the tokenizer, and the sizes of the run."""

    settings: "BackendSettings"
    cfg: Any  # rope_scaling.load.ModelConfig
    tokenizer: Any
    model: Any = None  # an already-loaded model (hf; tests, benchmarks)
    max_model_len: int | None = None  # what the run asks for (vllm)
    need_len: int | None = None  # the longest prompt + max new tokens (vllm)
    short_len: int | None = None  # the shortest prompt + max new tokens (vllm, longrope)
    log: Callable[[str], None] | None = None


class Backend(ABC):
    """What every generation backend is: a new backend is one subclass (its ``name`` and ``help``, :meth:`plan`,
    :meth:`describe`, :meth:`generate`) and one line in :data:`BACKENDS`."""

    name: ClassVar[str]
    help: ClassVar[str]  # --backend's help for it

    @classmethod
    @abstractmethod
    def plan(cls, job: BackendJob) -> tuple[Hashable, Callable[[], "Backend"]]:
        """(what must be equal for a backend built for another job to serve this one, a function that builds it).
        A job the backend cannot run is refused here (InputError), before anything is written."""

    @abstractmethod
    def describe(self) -> dict:
        """What run.json records about the backend (``info.backend_info``)."""

    @abstractmethod
    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        """Greedy continuations of every item; ``on_done(item, new token ids cut at the first EOS)`` as each
        finishes."""


def eos_ids_of(model_dir, config, tokenizer) -> list[int]:
    """EOS ids from the model's generation_config.json, else its config, else the tokenizer."""
    eos = None
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except (OSError, ValueError):
        eos = None
    return _as_list(eos) or _as_list(getattr(config, "eos_token_id", None)) or _as_list(tokenizer.eos_token_id)


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]


def plan_batches(lengths: Sequence[int], max_new_tokens: int, budget: int, max_batch: int) -> list[list[int]]:
    """Indices grouped into batches, longest inputs first: a batch holds as many samples as fit in ``budget``
    tokens (batch size x (its longest input + max_new_tokens)), at most ``max_batch``, at least one."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) >= max_batch or (len(cur) + 1) * (longest + max_new_tokens) > budget):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda asked for, but torch sees no CUDA device")
    return device


def pick_dtype(dtype: str, device: str):
    """``--dtype`` (ropescale.common.cli.DTYPES) as a torch dtype; auto: fp32 on CPU, bf16 on GPU."""
    try:
        return torch_dtype(dtype, cuda=device != "cpu")
    except ValueError as e:
        raise InputError(f"--dtype: {e}") from None


def attn_implementation(device: str, dtype) -> str:
    """FlashAttention-2 where it can run (importable, CUDA, half precision), else PyTorch SDPA."""
    import torch

    if device.startswith("cuda") and dtype in (torch.bfloat16, torch.float16):
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except Exception:
            pass
    return "sdpa"


class HFBackend(Backend):
    """transformers on CPU or GPU: the slot decoder, or ``generate`` on length-sorted, left-padded batches (see
    module doc)."""

    name = "hf"
    help = "CPU or GPU"

    @classmethod
    def plan(cls, job: BackendJob):
        def build():
            return cls(job.cfg.path, job.cfg.config, job.tokenizer, job.settings, model=job.model, log=job.log,
                       state=job.cfg.state)

        return ("hf", str(job.cfg.path), job.settings, id(job.model)), build

    def __init__(self, model_dir, config, tokenizer, settings: BackendSettings | None = None, *, model=None, log=None,
                 state=None, **fields):
        """``settings`` (or its fields as keywords, e.g. ``cache="static"``) as :class:`BackendSettings`; ``model``:
        an already-loaded model (tests, benchmarks); ``state``: the RopeState read with ``config``."""
        st = dataclasses.replace(settings or BackendSettings(), **fields)
        self.log = log or (lambda m: print(m, file=sys.stderr))
        self.device = pick_device(st.device)
        self.dtype = pick_dtype(st.dtype, self.device)
        self.tokenizer = tokenizer
        if st.cache not in CACHES:
            raise InputError(f"unknown --cache {st.cache!r} ({', '.join(CACHES)})")
        self.cache = st.cache
        self.compile = bool(st.compile)
        self.cuda_graph = bool(st.cuda_graph)
        batch_tokens, max_batch = st.batch_tokens, st.max_batch
        if model is None:
            from rope_scaling.load import load_model

            self.attn = attn_implementation(self.device, self.dtype)
            model = load_model(model_dir, config, dtype=self.dtype, attn=self.attn, state=state).to(self.device)
        else:
            self.attn = compat.attn_implementation(model.config)
        self.model = model.eval()
        self.eos = eos_ids_of(model_dir, config, tokenizer)
        if not self.eos:
            raise InputError("the model defines no EOS token (generation_config / config / tokenizer)", model_dir)
        pad = tokenizer.pad_token_id
        self.pad = int(pad) if pad is not None else self.eos[0]
        self.max_batch = max(1, int(max_batch))
        self.batch_tokens = batch_tokens
        if self.cache == "slots":
            from .engine import supported

            why = supported(self.model)
            if why:
                self.log(f"[generate] --cache slots not available ({why}); using transformers generate with a "
                         "static cache")
                self.cache = "static"
        self.graph_used = None
        self.compactions = 0  # left shifts of the slot decoder's buffers (tests check the path is taken)

    def describe(self) -> dict:
        d = {"backend": "hf", "device": self.device, "dtype": str(self.dtype).replace("torch.", ""),
             "attn_implementation": self.attn, "cache": self.cache, "batch_tokens": self.batch_tokens,
             "max_batch": self.max_batch}
        if self.cache == "slots":
            d["cuda_graph"] = self.cuda_graph and self.device.startswith("cuda")
        else:
            d["compile"] = self.compile
        return d

    def decoding(self) -> "SlotDecoding | PaddedDecoding":
        """How this backend decodes (its ``--cache``): the slot decoder, or padded ``generate`` batches."""
        return SlotDecoding(self) if self.cache == "slots" else PaddedDecoding(self)

    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        if items:
            self.decoding().run(items, max_new_tokens, min_new_tokens, on_done)


class SlotDecoding:
    """The hf backend's ``--cache slots``: the slot decoder (:class:`ropescale.evaluation.engine.SlotDecoder`)
    with as many slots as the token budget holds, halved and retried on a CUDA out-of-memory error."""

    def __init__(self, be: HFBackend):
        self.be = be

    def slots(self, max_new_tokens: int, longest: int) -> int:
        """How many slots the slot decoder gets: what the token budget holds at ``longest + 2 x max_new_tokens``
        tokens a slot (its buffer length); on CUDA the budget is 90% of the free memory less one prefill of the
        longest prompt, counted as KV bytes per token."""
        import torch

        from .engine import slot_bytes_per_token

        be = self.be
        per_slot = longest + 2 * max_new_tokens
        if be.batch_tokens:
            budget = be.batch_tokens
        elif not be.device.startswith("cuda"):
            # CPU: a decode step is bound by reading the slots' caches, plus a fixed per-step cost that more slots
            # share (tiny default, 2K prompts, 400 new tokens: 2 slots 2.0x, 12 slots 2.7x plain generate; 16
            # prompts of 4K, 128 new tokens: 16 slots 15.9 s vs 20.7 s with 7). So the budget is 32K tokens or
            # CPU_SLOT_CACHE_BYTES of cache, whichever holds more, and at most a quarter of the RAM
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            per_token = slot_bytes_per_token(be.model.config, be.dtype)
            budget = min(max(32768, CPU_SLOT_CACHE_BYTES // per_token), int(ram / 4 / per_token))
        else:
            cfg = be.model.config
            b = torch.finfo(be.dtype).bits // 8
            # one prefill's activations (hidden-size and MLP-width tensors of the longest prompt, x1.5 for the
            # allocator's slack; measured peak at 17K on a 7B shape: ~3.5 GiB) and 1 GiB for the decode graph
            prefill = 1.5 * longest * (8 * cfg.hidden_size + 4 * cfg.intermediate_size) * b + 2 ** 30
            torch.cuda.empty_cache()  # cached blocks from earlier work count as free
            free, _ = torch.cuda.mem_get_info(torch.device(be.device))
            budget = int((0.9 * free - prefill) / slot_bytes_per_token(cfg, be.dtype))
        return max(1, min(be.max_batch, budget // per_slot))

    def run(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        import torch

        from .engine import SlotDecoder

        be = self.be
        todo = {id(it): it for it in items}

        def done(it, ids):
            todo.pop(id(it), None)
            on_done(it, ids)

        slots = self.slots(max_new_tokens, max(len(it.input_ids) for it in items))
        while todo:
            oom = False
            dec = SlotDecoder(be.model, slots=slots, eos=be.eos, device=be.device, cuda_graph=be.cuda_graph,
                              log=be.log)
            try:
                dec.run(list(todo.values()), max_new_tokens, min_new_tokens, done)
                be.graph_used = dec.graph_used
                be.compactions = dec.compactions
            except torch.OutOfMemoryError:
                if slots == 1:
                    raise
                oom = True
            del dec  # outside the except block: its traceback no longer pins the slot buffers
            if oom:
                torch.cuda.empty_cache()
                slots = max(1, slots // 2)
                be.log(f"[generate] out of memory; retrying the {len(todo)} unfinished samples with {slots} slots")


class PaddedDecoding:
    """The hf backend's ``--cache static|dynamic``: transformers ``generate`` on length-sorted, left-padded batches
    sized by a token budget, a batch halved and retried on a CUDA out-of-memory error."""

    def __init__(self, be: HFBackend):
        self.be = be

    def budget(self, max_new_tokens: int, longest: int) -> int:
        """Token budget for a batch: ``--batch-tokens``, else on CPU a fixed 8K tokens (measured on the tiny model:
        a CPU decode step costs about linearly in the batch, and a padded prefill runs SDPA's slower masked path, so
        the gain comes from amortising per-step overhead over a few samples, not from big batches); on CUDA what
        70% of the free memory holds, counting per token the KV cache plus prefill activations and one row of the
        padding mask."""
        import torch

        from .engine import slot_bytes_per_token

        be = self.be
        if be.batch_tokens:
            return be.batch_tokens
        if not be.device.startswith("cuda"):
            return 8192
        cfg = be.model.config
        b = torch.finfo(be.dtype).bits // 8
        kv_bytes = slot_bytes_per_token(cfg, be.dtype)
        act_bytes = (6 * cfg.hidden_size + 3 * cfg.intermediate_size) * b + (longest + max_new_tokens)
        free, _ = torch.cuda.mem_get_info(torch.device(be.device))
        return max(longest + max_new_tokens, int(0.7 * free / (kv_bytes + act_bytes)))

    def batch(self, seqs: list[list[int]], max_new_tokens: int, min_new_tokens: int) -> list[list[int]]:
        """One left-padded batch through ``generate``: each row's new tokens cut at the first EOS."""
        import torch
        from transformers import GenerationConfig

        from .engine import longrope_for, reset_dynamic_rope

        be = self.be
        longest = max(map(len, seqs))
        ids = torch.full((len(seqs), longest), be.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), longest), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding: the last prompt token of every row sits at the same column
            ids[r, longest - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[r, longest - len(s):] = 1
        gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                              min_new_tokens=min(min_new_tokens, max_new_tokens), eos_token_id=be.eos,
                              pad_token_id=be.pad, use_cache=True,
                              cache_implementation="static" if be.cache == "static" else None,
                              disable_compile=not be.compile)
        reset_dynamic_rope(be.model)  # dynamic NTK: start each batch from the original base, not the last one's
        # longrope: one factor set for the whole batch (its samples are on one side: :meth:`run`), every step
        with torch.inference_mode(), longrope_for(be.model, longest + max_new_tokens):
            out = be.model.generate(input_ids=ids.to(be.device), attention_mask=mask.to(be.device),
                                    generation_config=gc)
        new = out[:, longest:].tolist()
        eos = set(be.eos)
        return [cut_at_eos(row, eos) for row in new]

    def run(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        import torch

        be = self.be
        lengths = [len(it.input_ids) for it in items]
        cap = be.max_batch
        budget = self.budget(max_new_tokens, max(lengths))
        queue = []
        for group in longrope_groups(be.model, items, max_new_tokens):  # all of them, unless longrope
            glen = [len(it.input_ids) for it in group]
            queue += [[group[i] for i in b] for b in plan_batches(glen, max_new_tokens, budget, cap)]
        while queue:
            batch = queue.pop(0)
            if len(batch) > cap:  # an earlier OOM lowered the cap
                queue.insert(0, batch[cap:])
                batch = batch[:cap]
            try:
                outs = self.batch([it.input_ids for it in batch], max_new_tokens, min_new_tokens)
            except torch.OutOfMemoryError:
                if len(batch) == 1:
                    raise
                torch.cuda.empty_cache()
                cap = max(1, len(batch) // 2)
                be.log(f"[generate] out of memory with a batch of {len(batch)}; retrying with {cap}")
                queue.insert(0, batch)
                continue
            for it, o in zip(batch, outs):
                on_done(it, o)


def longrope_groups(model, items: Sequence[Item], max_new_tokens: int) -> list[list[Item]]:
    """``items`` split by the LongRoPE factor set each sample takes (``engine.longrope_long``: prompt + max new
    tokens past the original context or not), so that a padded batch never mixes them; one group for other
    models."""
    from ropescale.common.compat import longrope_modules

    from .engine import longrope_long

    mods = longrope_modules(model)
    if not mods:
        return [list(items)]
    groups: dict[bool, list[Item]] = {}
    for it in items:
        groups.setdefault(longrope_long(mods[0], len(it.input_ids) + max_new_tokens), []).append(it)
    return [groups[k] for k in sorted(groups)]


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
    from rope_scaling.formulas import REGISTRY, VllmJob
    from rope_scaling.hf import rope_entries, rope_state

    cfg = config if isinstance(config, dict) else config.to_dict()
    key, e = rope_entries(cfg)  # the one reader of HF rope entries (4.x and 5.x layouts)
    st = state if state is not None else rope_state(cfg)  # the spec the config carries
    rule = REGISTRY[st.spec.method].vllm
    if rule is None:
        raise InputError(f"--backend vllm: rope {st.spec.label()} is not served by vLLM here; use --backend hf")
    return rule(VllmJob(cfg, key, e, st, dict(overrides), int(need), int(need if short is None else short),
                        max(int(want), int(need)), vllm))


# ---------------------------------------------------------------- the registry and the settings
BACKENDS: dict[str, type[Backend]] = {"hf": HFBackend, "vllm": VLLMBackend}  # --backend NAME -> its class


@dataclass(frozen=True)
class BackendSettings:
    """How generation runs (nested in ``ropescale.evaluation.generate.GenerateSettings``; the same flags on
    generate/run)."""

    backend: str = setting("hf", "; ".join(f"{n}: {c.help}" for n, c in BACKENDS.items()), choices=tuple(BACKENDS),
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
