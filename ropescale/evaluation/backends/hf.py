"""The ``hf`` generation backend: transformers on CPU or GPU (the package doc says what every backend shares).

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
batch (static / dynamic) starts from the original base again, and the slot decoder gives each slot its own
frequencies, so each sample is decoded as batch-1 ``generate`` on a fresh model decodes it. (A padded batch of
``generate`` still shares one base: the longest row's; so does dynamic YaRN's length.) LongRoPE: each sample keeps one
factor set from its prefill on, long when prompt + max new tokens passes the original context; padded batches never
mix the two. Those rules, and LongRoPE's choice in one place: :mod:`ropescale.evaluation.rope_rules`.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Sequence

from rope_scaling.load import load_model
from ropescale.common import compat
from ropescale.common.cli import torch_dtype
from ropescale.common.io import InputError

from ..engine import SlotDecoder, cut_at_eos, slot_bytes_per_token, supported
from ..rope_rules import longrope_for, longrope_groups, reset_dynamic_ntk
from .base import Backend, BackendJob, Item, OnDone, eos_ids_of

if TYPE_CHECKING:
    from . import BackendSettings

CACHES = ("slots", "static", "dynamic")  # our slot decoder, or transformers generate with that cache
CPU_SLOT_CACHE_BYTES = 512 * 2 ** 20  # slot decoder on CPU: the cache a default batch may fill (or 32K tokens)


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

    def __init__(self, model_dir, config, tokenizer, settings: BackendSettings, *, model=None, log=None, state=None):
        """``settings``: the backend's settings (``backends.BackendSettings``); ``model``: an already-loaded model
        (tests, benchmarks); ``state``: the RopeState read with ``config``."""
        st = settings
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
        reset_dynamic_ntk(be.model)  # dynamic NTK: start each batch from the original base, not the last one's
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
