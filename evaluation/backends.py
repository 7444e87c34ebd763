"""Generation backends for ``eval_summ generate``: ``hf`` (transformers, CPU or GPU) and ``vllm`` (GPU only).

Both take token ids (tokenized once by :mod:`evaluation.generate`, so ``input_tokens`` means the same thing for
both) and return, per sample, the greedy continuation's token ids cut at the first EOS. Settings are the paper's
(Sec 4.2 / Appendix B.1): greedy decoding, at least ``min_new_tokens`` (10) new tokens, at most
``max_new_tokens``.

hf backend (why it is faster than calling ``model.generate`` once per sample):
- samples are sorted by input length (longest first, so an out-of-memory shows up at once and the ETA is
  conservative) and grouped into left-padded batches whose size is set by a token budget
  (batch * (longest input + max new tokens) <= budget); sorted batches carry almost no padding;
- one batched ``model.generate`` per batch (greedy, EOS handled per row); on a CUDA out-of-memory error the
  batch is split in half and retried, and later batches keep the smaller size;
- SDPA attention (FlashAttention-2 when ``flash_attn`` is importable, on CUDA, in bf16/fp16); fp32 on CPU, bf16
  on GPU; ``logits_to_keep=1`` during prefill (transformers does this), so a 16K prompt never materialises
  16K x vocab logits;
- a static KV cache (default): transformers' ``StaticCache``, allocated once per batch for prompt + max new
  tokens, so a decode step writes one position in place instead of concatenating (copying) the whole cache, as
  the dynamic cache does at every step (at a 16K prompt that copy is most of a step's memory traffic). It is not
  compiled unless ``compile=True`` (``--compile``: transformers then compiles the decode step on CUDA, once per new
  batch shape, which only pays off on long runs); ``cache="dynamic"`` is the plain transformers default.

Batching changes nothing but speed: greedy outputs equal those of plain batch-1 ``model.generate`` (tested on a
tiny random model in fp32 on CPU, token for token).

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
                 batch_tokens: int | None = None, max_batch: int = 64, cache: str = "static", compile: bool = False,
                 model=None, log=None):
        from transformers import AutoModelForCausalLM

        self.log = log or (lambda m: print(m, file=sys.stderr))
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.tokenizer = tokenizer
        if cache not in ("dynamic", "static"):
            raise InputError(f"unknown --cache {cache!r} (dynamic, static)")
        self.cache = cache
        self.compile = bool(compile)
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

    def describe(self) -> dict:
        return {"backend": "hf", "device": self.device, "dtype": str(self.dtype).replace("torch.", ""),
                "attn_implementation": self.attn, "cache": self.cache, "compile": self.compile,
                "batch_tokens": self.batch_tokens, "max_batch": self.max_batch}

    def _auto_budget(self, max_new_tokens: int, longest: int) -> int:
        """Token budget for a batch: on CPU a fixed 8K tokens (measured on the tiny model: a CPU decode step costs
        about linearly in the batch, and a padded prefill runs SDPA's slower masked path, so the gain comes from
        amortising per-step overhead over a few samples, not from big batches); on CUDA what 70% of the free memory
        holds, counting per token the KV cache plus prefill activations and one row of the padding mask."""
        import torch

        if not self.device.startswith("cuda"):
            return 8192
        cfg = self.model.config
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        b = torch.finfo(self.dtype).bits // 8
        kv_bytes = 2 * cfg.num_hidden_layers * kv * head_dim * b
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

    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        import torch

        if not items:
            return
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
