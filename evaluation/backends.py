"""Generation backends for ``eval_summ generate``: ``hf`` (transformers, CPU or GPU) and ``vllm`` (GPU only).

Both take token ids (tokenized once by :mod:`evaluation.generate`, so ``input_tokens`` means the same thing for
both) and return, per sample, the greedy continuation's token ids cut at the first EOS. Settings are the paper's
(Sec 4.2 / Appendix B.1): greedy decoding, at least ``min_new_tokens`` (10) new tokens, at most
``max_new_tokens``.

hf backend, ``cache="slots"`` (the default; :mod:`evaluation.engine`): ropescale's own greedy loop over a fixed
slot cache — each sample prefilled alone (no padding, SDPA's causal flash path), continuous batching (a finished
slot is refilled from the length-sorted queue), and on CUDA a decode step captured once as a CUDA graph. The slot
count comes from a token budget: slots x (longest prompt + 2 x max new tokens) <= ``batch_tokens`` (default 32K
tokens on CPU, at most a quarter of the RAM; on CUDA what 90% of the free memory holds after one prefill's
activations). On an H100 with a 7B
shape at 12-17K prompts this is 12.4x plain batch-1 ``generate`` (README). It needs transformers 5.x and SDPA;
otherwise the backend falls back to ``static`` with a note.

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

vllm backend: imported lazily (``pip install vllm`` on a CUDA machine); the RoPE setting is passed as
``hf_overrides`` (the config fields that :func:`rope_scaling.apply_rope` changed) and ``max_model_len`` is the
paper's rule, twice the subset's target length, raised if needed so the longest prompt + generation fits.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ropescale.io import InputError

BACKENDS = ("hf", "vllm")
CACHES = ("slots", "static", "dynamic")  # hf backend: our slot decoder, or transformers generate with that cache


@dataclass
class Item:
    """One prepared sample: its id and the prompt's token ids."""

    id: object
    input_ids: list[int]
    extra: dict = field(default_factory=dict)


OnDone = Callable[[Item, list[int]], None]


def cut_at_eos(ids: Sequence[int], eos_ids: set[int]) -> list[int]:
    """Token ids up to (not including) the first EOS."""
    out = []
    for t in ids:
        if t in eos_ids:
            break
        out.append(int(t))
    return out


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
    import torch

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise InputError(f"unknown --dtype {dtype!r} (auto, float32, bfloat16, float16)") from None


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


class HFBackend:
    """transformers ``generate`` on length-sorted, left-padded batches (see module doc)."""

    name = "hf"

    def __init__(self, model_dir, config, tokenizer, *, device: str = "auto", dtype: str = "auto",
                 batch_tokens: int | None = None, max_batch: int = 64, cache: str = "slots", compile: bool = False,
                 cuda_graph: bool = True, model=None, log=None):
        from transformers import AutoModelForCausalLM

        self.log = log or (lambda m: print(m, file=sys.stderr))
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.tokenizer = tokenizer
        if cache not in CACHES:
            raise InputError(f"unknown --cache {cache!r} ({', '.join(CACHES)})")
        self.cache = cache
        self.compile = bool(compile)
        self.cuda_graph = bool(cuda_graph)
        if model is None:
            self.attn = attn_implementation(self.device, self.dtype)
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, dtype=self.dtype,
                                                         attn_implementation=self.attn)
            model = model.to(self.device)
        else:
            self.attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
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

    def describe(self) -> dict:
        d = {"backend": "hf", "device": self.device, "dtype": str(self.dtype).replace("torch.", ""),
             "attn_implementation": self.attn, "cache": self.cache, "batch_tokens": self.batch_tokens,
             "max_batch": self.max_batch}
        if self.cache == "slots":
            d["cuda_graph"] = self.cuda_graph and self.device.startswith("cuda")
        else:
            d["compile"] = self.compile
        return d

    def _auto_budget(self, max_new_tokens: int, longest: int) -> int:
        """Token budget for a batch: on CPU a fixed 8K tokens (measured on the tiny model: a CPU decode step costs
        about linearly in the batch, and a padded prefill runs SDPA's slower masked path, so the gain comes from
        amortising per-step overhead over a few samples, not from big batches); on CUDA what 70% of the free memory
        holds, counting per token the KV cache plus prefill activations and one row of the padding mask."""
        import torch

        from .engine import slot_bytes_per_token

        if not self.device.startswith("cuda"):
            return 8192
        cfg = self.model.config
        b = torch.finfo(self.dtype).bits // 8
        kv_bytes = slot_bytes_per_token(cfg, self.dtype)
        act_bytes = (6 * cfg.hidden_size + 3 * cfg.intermediate_size) * b + (longest + max_new_tokens)
        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        return max(longest + max_new_tokens, int(0.7 * free / (kv_bytes + act_bytes)))

    def _generate_batch(self, seqs: list[list[int]], max_new_tokens: int, min_new_tokens: int) -> list[list[int]]:
        import torch
        from transformers import GenerationConfig

        longest = max(map(len, seqs))
        ids = torch.full((len(seqs), longest), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), longest), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding: the last prompt token of every row sits at the same column
            ids[r, longest - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[r, longest - len(s):] = 1
        gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                              min_new_tokens=min(min_new_tokens, max_new_tokens), eos_token_id=self.eos,
                              pad_token_id=self.pad, use_cache=True,
                              cache_implementation="static" if self.cache == "static" else None,
                              disable_compile=not self.compile)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      generation_config=gc)
        new = out[:, longest:].tolist()
        eos = set(self.eos)
        return [cut_at_eos(row, eos) for row in new]

    def _slots(self, max_new_tokens: int, longest: int) -> int:
        """How many slots the slot decoder gets: what the token budget holds at ``longest + 2 x max_new_tokens``
        tokens a slot (its buffer length); on CUDA the budget is 90% of the free memory less one prefill of the
        longest prompt, counted as KV bytes per token."""
        import torch

        from .engine import slot_bytes_per_token

        per_slot = longest + 2 * max_new_tokens
        if self.batch_tokens:
            budget = self.batch_tokens
        elif not self.device.startswith("cuda"):
            # CPU: a decode step is bound by reading the slots' caches, plus a fixed per-step cost that more slots
            # share (tiny default, 2K prompts, 400 new tokens: 2 slots 2.0x, 12 slots 2.7x plain generate); at
            # most a quarter of the RAM
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            budget = min(32768, int(ram / 4 / slot_bytes_per_token(self.model.config, self.dtype)))
        else:
            cfg = self.model.config
            b = torch.finfo(self.dtype).bits // 8
            # one prefill's activations (hidden-size and MLP-width tensors of the longest prompt, x1.5 for the
            # allocator's slack; measured peak at 17K on a 7B shape: ~3.5 GiB) and 1 GiB for the decode graph
            prefill = 1.5 * longest * (8 * cfg.hidden_size + 4 * cfg.intermediate_size) * b + 2 ** 30
            torch.cuda.empty_cache()  # cached blocks from earlier work count as free
            free, _ = torch.cuda.mem_get_info(torch.device(self.device))
            budget = int((0.9 * free - prefill) / slot_bytes_per_token(cfg, self.dtype))
        return max(1, min(self.max_batch, budget // per_slot))

    def _generate_slots(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int,
                        on_done: OnDone) -> None:
        import torch

        from .engine import SlotDecoder

        todo = {id(it): it for it in items}

        def done(it, ids):
            todo.pop(id(it), None)
            on_done(it, ids)

        slots = self._slots(max_new_tokens, max(len(it.input_ids) for it in items))
        while todo:
            oom = False
            dec = SlotDecoder(self.model, slots=slots, eos=self.eos, device=self.device,
                              cuda_graph=self.cuda_graph, log=self.log)
            try:
                dec.run(list(todo.values()), max_new_tokens, min_new_tokens, done)
                self.graph_used = dec.graph_used
                self.compactions = dec.compactions
            except torch.OutOfMemoryError:
                if slots == 1:
                    raise
                oom = True
            del dec  # outside the except block: its traceback no longer pins the slot buffers
            if oom:
                torch.cuda.empty_cache()
                slots = max(1, slots // 2)
                self.log(f"[generate] out of memory; retrying the {len(todo)} unfinished samples with {slots} "
                         "slots")

    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        import torch

        if not items:
            return
        if self.cache == "slots":
            return self._generate_slots(items, max_new_tokens, min_new_tokens, on_done)
        lengths = [len(it.input_ids) for it in items]
        budget = self.batch_tokens or self._auto_budget(max_new_tokens, max(lengths))
        cap = self.max_batch
        queue = [[items[i] for i in b] for b in plan_batches(lengths, max_new_tokens, budget, cap)]
        while queue:
            batch = queue.pop(0)
            if len(batch) > cap:  # an earlier OOM lowered the cap
                queue.insert(0, batch[cap:])
                batch = batch[:cap]
            try:
                outs = self._generate_batch([it.input_ids for it in batch], max_new_tokens, min_new_tokens)
            except torch.OutOfMemoryError:
                if len(batch) == 1:
                    raise
                torch.cuda.empty_cache()
                cap = max(1, len(batch) // 2)
                self.log(f"[generate] out of memory with a batch of {len(batch)}; retrying with {cap}")
                queue.insert(0, batch)
                continue
            for it, o in zip(batch, outs):
                on_done(it, o)


class VLLMBackend:
    """vLLM offline inference (GPU only; imported lazily)."""

    name = "vllm"

    def __init__(self, model_dir, config, tokenizer, *, rope_overrides: dict, max_model_len: int,
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
        self.overrides = dict(rope_overrides)
        # vLLM refuses a max_model_len beyond what the config derives unless told otherwise; evaluating
        # extrapolation beyond the trained length is the point here (the paper patched vLLM for the same reason).
        os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        self.chunk = chunk
        self.dtype = "bfloat16" if dtype == "auto" else dtype
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


def rope_overrides(before: dict, after: dict) -> dict:
    """The config fields a RoPE change touched (``after`` vs ``before``, both ``config.to_dict()``)."""
    keys = ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings")
    return {k: after[k] for k in keys if k in after and after.get(k) != before.get(k)}


def make_backend(name: str, model_dir, config, tokenizer, **kw):
    if name == "hf":
        kw = {k: v for k, v in kw.items() if k not in ("rope_overrides", "max_model_len")}
        return HFBackend(model_dir, config, tokenizer, **kw)
    if name == "vllm":
        kw = {k: v for k, v in kw.items() if k in ("rope_overrides", "max_model_len", "dtype", "log")}
        return VLLMBackend(model_dir, config, tokenizer, **kw)
    raise InputError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
