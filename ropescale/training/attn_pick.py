"""The fastest attention kernel the device has, picked by a short measurement when a run starts.

On CUDA, SDPA (``torch.nn.functional.scaled_dot_product_attention``) has several kernels for the same math: cuDNN's
(fast on Hopper), FlashAttention-2's (torch's own build), the memory-efficient one; and the flash_attn package's
FlashAttention-2 may be installed beside it. :func:`measure` times one causal forward + backward of each on the
run's attention shape (heads, head dim, the sample length up to :data:`PROBE_TOKENS`) in bf16, and :func:`pick`
takes the fastest that ran. The SDPA kernel chosen is made SDPA's first choice for the rest of the process
(``compat.prefer_sdpa_backend``: the others stay enabled behind it, for inputs it does not take); FlashAttention-2
is chosen by loading the model with ``attn_implementation="flash_attention_2"``. Everything measured, and what
failed with why, is recorded in run.json. On CPU there is nothing to choose: SDPA picks its CPU kernel.
"""
from __future__ import annotations

import statistics
import sys
import time

PROBE_TOKENS = 16384  # the check's sequence length at most: ~20 ms a kernel on an H100 for a 7B shape
SDPA_KERNELS = ("cudnn", "flash", "efficient")  # cheapest to try first; "math" only where asked
REPS = 3


def pick(timings: dict) -> str | None:
    """The fastest entry of ``{kernel: milliseconds, or a string saying why it did not run}`` (ties: the first
    listed), or None when none ran."""
    ok = [(ms, i, k) for i, (k, ms) in enumerate(timings.items()) if isinstance(ms, (int, float))]
    return min(ok)[2] if ok else None


def _timer(device):
    """(start, stop -> ms) around a region: CUDA events on CUDA, the wall clock elsewhere."""
    import torch

    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop():
            b.record()
            b.synchronize()
            return a.elapsed_time(b)

        return (lambda: a.record()), stop
    t = [0.0]
    return (lambda: t.__setitem__(0, time.perf_counter())), (lambda: 1000 * (time.perf_counter() - t[0]))


def measure(*, heads: int, head_dim: int, tokens: int, device=None, dtype=None, kernels=SDPA_KERNELS,
            flash_attn: bool = False, reps: int = REPS) -> dict:
    """Milliseconds of one causal forward + backward per kernel (the median of ``reps`` after one warm-up), or why
    it did not run (``"unavailable: ..."``). ``device``: default the current CUDA device."""
    import torch
    import torch.nn.functional as F

    from ropescale.common.compat import sdpa_backend_context

    device = device or torch.device("cuda", torch.cuda.current_device())
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, head_dim, device=device, dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    grad = torch.randn(1, heads, tokens, head_dim, device=device, dtype=dtype, generator=g)
    out = {}
    runs = [(name, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), name) for name in kernels]
    if flash_attn:
        runs.append(("flash_attention_2", lambda: _fa2(q, k, v), None))
    for name, fn, backend in runs:
        try:
            with sdpa_backend_context(backend):
                times = []
                for i in range(reps + 1):
                    start, stop = _timer(device)
                    start()
                    o = fn()
                    o.backward(grad)
                    ms = stop()
                    if i:
                        times.append(ms)
                    q.grad = k.grad = v.grad = None
            out[name] = round(statistics.median(times), 3)
        except Exception as e:  # a kernel this device or these inputs do not have: recorded, never fatal
            out[name] = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return out


def _fa2(q, k, v):
    from flash_attn import flash_attn_func

    return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)


def choose(attn: str, backend: str, *, cuda: bool, heads: int, head_dim: int, tokens: int, world: int = 1,
           measure_fn=measure) -> tuple[str, dict]:
    """(the attention implementation to load the model with, the record): ``attn`` as resolved by
    ``model.resolve_attn`` unless it was ``auto`` (then the fastest of FlashAttention-2, where importable, and the
    SDPA kernels); ``backend`` (``--sdpa-backend``): auto (measured), default (SDPA's own order, nothing measured)
    or a kernel name (preferred without measuring)."""
    import importlib.util

    from ropescale.common.compat import prefer_sdpa_backend

    rec = {"requested": {"attn": attn, "sdpa_backend": backend}}
    fa2 = cuda and importlib.util.find_spec("flash_attn") is not None
    resolved = "flash_attention_2" if (attn == "auto" and fa2) else ("sdpa" if attn == "auto" else attn)
    if not cuda:
        rec.update(attn=resolved, sdpa_backend="default", why="CPU: SDPA picks its own kernel")
        return resolved, rec
    if backend != "auto" or resolved not in ("sdpa", "flash_attention_2") or world > 1 or attn not in ("auto",
                                                                                                        "sdpa"):
        how = prefer_sdpa_backend(backend) if backend not in ("auto", "default") else "default"
        why = f"{world} processes: each would measure its own" if world > 1 and backend == "auto" else "as given"
        rec.update(attn=resolved, sdpa_backend=backend if backend != "auto" else "default", how=how, why=why)
        return resolved, rec
    t0 = time.time()
    timings = measure_fn(heads=heads, head_dim=head_dim, tokens=min(tokens, PROBE_TOKENS),
                         flash_attn=fa2 and attn == "auto")
    best = pick(timings)
    rec.update(timings_ms=timings, probe_tokens=min(tokens, PROBE_TOKENS), seconds=round(time.time() - t0, 2))
    if best is None:
        rec.update(attn="sdpa", sdpa_backend="default", why="no kernel ran in the check: SDPA's own order")
        return "sdpa", rec
    if best == "flash_attention_2":
        rec.update(attn=best, sdpa_backend="default", why="fastest in the check")
        return best, rec
    rec.update(attn="sdpa", sdpa_backend=best, how=prefer_sdpa_backend(best), why="fastest in the check")
    return "sdpa", rec


def for_run(settings, resolved: str, config, *, cuda: bool, context: int, world: int,
            resumed: str | None = None) -> tuple[str, dict]:
    """A finetune run's attention (:func:`choose` on the model's heads and head dim): a resume with ``--attn auto``
    keeps the implementation its run chose (``resumed``) and measures nothing."""
    if resumed and settings.attn == "auto":
        return resumed, {}
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
    attn, rec = choose("auto" if settings.attn == "auto" else resolved, settings.sdpa_backend, cuda=cuda,
                       heads=heads, head_dim=head_dim, tokens=context, world=world)
    log(f"[finetune] attention: {describe(rec)}")
    return attn, rec


def describe(rec: dict) -> str:
    t = rec.get("timings_ms")
    got = f"{rec['attn']}" + (f" ({rec['sdpa_backend']} kernel)" if rec.get("attn") == "sdpa" else "")
    if t:
        parts = [f"{k} {v:.1f} ms" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in t.items()]
        return (f"{got}, {rec.get('why')}: causal forward + backward at {rec['probe_tokens']:,} tokens: "
                + "; ".join(parts))
    return f"{got} ({rec.get('why', '')})"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
