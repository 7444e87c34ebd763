"""Memory for long samples on one GPU: checkpoints offloaded to pinned host memory, a tiled MLP, a host-RAM check.

Where the memory of a training step goes at long sequences (T tokens, Qwen1.5-7B shape: 32 layers, hidden 4096,
intermediate 11,008, bf16, gradient checkpointing on every decoder layer; the LM head is label-only and chunked,
:mod:`ropescale.training.loss`):

- the checkpoints: each decoder layer keeps its input for the recompute in backward, layers x T x hidden x 2 bytes
  = 256 KiB a token (2 GiB a layer and 64 GiB in all at 256K). :class:`CheckpointOffloader` copies each layer's
  input to pinned host memory on a side CUDA stream as soon as the layer has run (the GPU copy is freed once the
  copy is done), and brings it back on that stream while the layer above it is recomputed, so the copies overlap
  the compute. The GPU holds one or two checkpoints instead of all of them; host memory holds all of them:
  :func:`check_host_memory` refuses (one line, before training) when it cannot.
- the recompute of one layer in backward: besides attention, its MLP's intermediate activations (gate, up,
  act(gate), their product: 4 x T x intermediate x 2 bytes, 22 GiB at 256K). :func:`enable_tiled_mlp` computes
  each layer's MLP over chunks of N tokens without keeping anything (forward under no_grad) and recomputes it
  chunk by chunk in backward (ALST's TiledMLP, Bekman et al. 2025): 4 x N x intermediate x 2 bytes (344 MiB at
  N = 4096). The MLP runs once more per step (3 forwards instead of 2 with checkpointing), a few per cent of a
  step at 256K, where attention dominates.

How the offload hooks in: transformers runs each checkpointed decoder layer through the layer's
``_gradient_checkpointing_func(layer_forward, hidden_states, ...)``; :func:`enable_checkpoint_offload` replaces it
on every layer by :meth:`CheckpointOffloader.checkpoint_fn`, which calls torch's non-reentrant checkpoint inside a
``saved_tensors_hooks`` pair. Non-reentrant checkpointing saves the function's positional inputs (the
checkpoint) through the saved-tensor hooks active around it, and what the layer saves inside goes to its own
placeholders; so the pair sees exactly the checkpoint (torch's ``save_on_cpu`` + checkpoint, which transformers 5
offers as ``activation_checkpointing_enable(offload=True)``, works the same way but copies on the compute
stream, without overlap). PEFT models and DeepSpeed engines keep the decoder layers as they are, so both work.

Host memory is kept in a pool of fixed-size pinned pages (32 MiB by default) reused from step to step: samples of
varying length reuse the same pages, and the pool never exceeds layers x ceil(checkpoint / page) pages, what the
check counts (torch's pinned allocator would round each buffer up to a power of two: up to twice the memory).
On a CPU-only machine the same code runs with synchronous copies into pageable pages (what the tests exercise).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import weakref
from dataclasses import dataclass, field

import torch

from ropescale.common import compat
from ropescale.common.host import available_host_bytes  # torch-free home; check_host_memory reads it here
from ropescale.common.io import InputError

# auto: offload the checkpoints / tile the MLP on CUDA from this many tokens per micro-batch on. Measured on an
# H100 with the 7B shape (README "Measured"): 16K trains in 10 GiB and 32K in 37 GiB without either; the
# checkpoints grow by 256 KiB a token (16 GiB at 64K, 32 GiB at 128K) and the MLP's recompute by 172 KiB a token,
# so from 64K on they are what decides whether a sample fits on an 80 GB GPU (128K needed 68 GiB, 256K does not
# fit), while below it offloading only costs host memory and PCIe bandwidth (shared with ZeRO-3's parameter
# offload) for memory the run does not need.
AUTO_MIN_TOKENS = 65536
PAGE_BYTES = 32 << 20  # pinned host pages of the checkpoint pool
HOST_HEADROOM = 0.9  # use at most this share of the available host memory (pinned pages cannot be swapped out)
DS_OFFLOAD_BYTES_PER_PARAM = 16  # DeepSpeed's offloaded optimizer: fp32 master + Adam m, v + fp32 grad per param


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- settings
def parse_offload(value) -> str:
    """--offload-checkpoints: "auto", "true" or "false" (InputError naming the flag otherwise)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    s = str("auto" if value is None else value).strip().lower()
    table = {"auto": "auto", "true": "true", "1": "true", "yes": "true", "on": "true", "false": "false", "0": "false",
             "no": "false", "off": "false"}
    if s not in table:
        raise InputError(f"--offload-checkpoints must be auto, true or false, not {value!r}")
    return table[s]


def resolve_offload(value, *, cuda: bool, gradient_checkpointing: bool, tokens: int) -> bool:
    """Whether to offload the checkpoints: true/false as given; auto = on CUDA, with gradient checkpointing, from
    :data:`AUTO_MIN_TOKENS` tokens per micro-batch on."""
    v = parse_offload(value)
    if v == "true" and not gradient_checkpointing:
        raise InputError("--offload-checkpoints true needs --gradient-checkpointing true (without it there are no "
                         "checkpoints to offload)")
    if v == "auto":
        return bool(cuda and gradient_checkpointing and tokens >= AUTO_MIN_TOKENS)
    return v == "true"


def resolve_tile(value, *, cuda: bool, tokens: int, hidden: int) -> int:
    """Tokens per MLP chunk (0 = no tiling): N as given; None/"auto" = the hidden size (ALST's choice: as many
    chunks as the sequence has hidden sizes) on CUDA from :data:`AUTO_MIN_TOKENS` tokens on, else 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return int(hidden) if cuda and tokens >= AUTO_MIN_TOKENS else 0
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--tile-mlp must be a number of tokens, 0 (off) or auto, not {value!r}") from None
    if n < 0:
        raise InputError(f"--tile-mlp must be >= 0 (0: off), got {n}")
    return n


# ---------------------------------------------------------------- host memory
def checkpoint_bytes(layers: int, tokens: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of the checkpoints of one micro-batch: layers x tokens (micro batch x sequence) x hidden x dtype."""
    return int(layers) * int(tokens) * int(hidden) * int(dtype_bytes)


def pool_bytes(layers: int, tokens: int, hidden: int, dtype_bytes: int, page_bytes: int = PAGE_BYTES) -> int:
    """Host bytes the offload pool reaches: every layer's checkpoint in whole pages."""
    per_layer = int(tokens) * int(hidden) * int(dtype_bytes)
    return int(layers) * math.ceil(per_layer / page_bytes) * page_bytes


def gib(n: float) -> str:
    """``64.0 GiB``; below 0.1 GiB in MiB (``12.0 MiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 0.1 * 2**30 else f"{n / 2**20:.1f} MiB"


def check_host_memory(need: int, *, what: str, extra: int = 0, extra_what: str = "", available: int | None = None,
                      processes: int = 1) -> int:
    """Refuse (InputError, one line) when ``processes`` x (``need`` + ``extra``) bytes do not fit in
    :data:`HOST_HEADROOM` of the available host memory. Returns the available bytes."""
    avail = available_host_bytes() if available is None else int(available)
    total = (int(need) + int(extra)) * max(1, int(processes))
    if total > HOST_HEADROOM * avail:
        parts = f"{what} needs {gib(need)} of pinned host memory"
        if extra:
            parts += f" (+ {gib(extra)} for {extra_what})"
        if processes > 1:
            parts += f" in each of {processes} processes on this machine"
        raise InputError(f"host memory: {parts}, but only {gib(avail)} is available (at most "
                         f"{int(HOST_HEADROOM * 100)}% of it is used); pass --offload-checkpoints false, train on "
                         f"shorter samples or a smaller --micro-batch, or use a machine with more RAM")
    return avail


def ds_offload_extra(ds_config: dict | None, trainable: int) -> int:
    """Host bytes DeepSpeed still allocates when its engine starts (after the model is set up): the offloaded
    optimizer's states (an estimate: :data:`DS_OFFLOAD_BYTES_PER_PARAM` per trained parameter)."""
    if not ds_config:
        return 0
    zo = ds_config.get("zero_optimization", {}) or {}
    dev = (zo.get("offload_optimizer") or {}).get("device", "none")
    return int(trainable) * DS_OFFLOAD_BYTES_PER_PARAM if dev not in (None, "none") else 0


# ---------------------------------------------------------------- checkpoint offload
class _Slot:
    """One offloaded checkpoint: its host pages, how to rebuild it, and the copies in flight."""

    __slots__ = ("pages", "shape", "dtype", "device", "nbytes", "fetched", "ready", "prev", "pool", "__weakref__")

    def __init__(self, pool, t: torch.Tensor, nbytes: int):
        self.pool = pool
        self.pages: list[torch.Tensor] | None = []
        self.shape, self.dtype, self.device, self.nbytes = t.shape, t.dtype, t.device, nbytes
        self.fetched: torch.Tensor | None = None  # the tensor back on its device (prefetched or fetched)
        self.ready = None  # CUDA event: the host-to-device copy is done
        self.prev = None  # weakref to the slot packed before this one (the next one backward needs)

    def __del__(self):  # never unpacked (no backward): the pages go back to the pool
        pages, self.pages = self.pages, None
        if pages:
            self.pool._free.extend(pages)


class CheckpointOffloader:
    """Moves each decoder layer's checkpoint to host memory and back (see module doc).

    ``page_bytes``: size of the host pages; ``pin``: page-locked pages (default: when CUDA is available). Counters
    in :attr:`stats`: checkpoints offloaded, bytes copied each way, prefetches issued and fetches that had to be
    started at unpack time (not prefetched)."""

    def __init__(self, page_bytes: int = PAGE_BYTES, pin: bool | None = None):
        self.page_bytes = int(page_bytes)
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self._free: list[torch.Tensor] = []
        self.pages_allocated = 0
        self._streams: dict = {}
        self._last: weakref.ref | None = None
        self.stats = {"offloaded": 0, "bytes_to_host": 0, "bytes_to_device": 0, "prefetched": 0, "late": 0}

    @property
    def host_bytes(self) -> int:
        """Host memory held by the pool (pages in use + free)."""
        return self.pages_allocated * self.page_bytes

    # -- the hook transformers calls
    def checkpoint_fn(self, base=None):
        """A drop-in ``_gradient_checkpointing_func``: ``fn(function, *args, **kwargs)`` = torch's non-reentrant
        checkpoint of ``function(*args, **kwargs)`` whose checkpoint (the first positional argument, the hidden
        states) lives in host memory until its recompute. ``base``: the checkpoint function to wrap (default
        ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=False``)."""
        if base is None:
            from torch.utils.checkpoint import checkpoint

            base = functools.partial(checkpoint, use_reentrant=False)

        def offloaded_checkpoint(function, *args, **kwargs):
            x = args[0] if args and torch.is_tensor(args[0]) else None
            if x is None or not torch.is_grad_enabled() or not x.is_floating_point():
                return base(function, *args, **kwargs)
            with self.hooks(x):
                return base(function, *args, **kwargs)

        offloaded_checkpoint._ropescale_offloader = self
        return offloaded_checkpoint

    def hooks(self, target: torch.Tensor):
        """saved_tensors_hooks that offload ``target`` (when it is saved) and keep every other tensor as is."""

        # the hooks live as long as the saved tensor (autograd keeps them with it): no reference to target
        key = (target.data_ptr(), tuple(target.shape), target.dtype, target.device)

        def pack(t):
            if (t.data_ptr(), tuple(t.shape), t.dtype, t.device) == key:
                return self._pack(t)
            return t

        def unpack(obj):
            return self._unpack(obj) if isinstance(obj, _Slot) else obj

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    # -- pages
    def _take_page(self) -> torch.Tensor:
        if self._free:
            return self._free.pop()
        self.pages_allocated += 1
        return torch.empty(self.page_bytes, dtype=torch.uint8, pin_memory=self.pin)

    def _stream(self, device: torch.device):
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device=device)
        return s

    @staticmethod
    def _bytes(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).view(torch.uint8)

    # -- device -> host
    def _pack(self, t: torch.Tensor) -> _Slot:
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        src = self._bytes(t)
        n = src.numel()
        slot = _Slot(self, t, n)
        slot.pages = [self._take_page() for _ in range(math.ceil(n / self.page_bytes))]
        P = self.page_bytes
        if t.is_cuda:
            stream = self._stream(t.device)
            stream.wait_stream(torch.cuda.current_stream(t.device))  # t is complete
            with torch.cuda.stream(stream):
                for i, page in enumerate(slot.pages):
                    a, b = i * P, min(n, (i + 1) * P)
                    page[:b - a].copy_(src[a:b], non_blocking=True)
            t.record_stream(stream)  # its memory is not reused before the copy is done
        else:
            for i, page in enumerate(slot.pages):
                a, b = i * P, min(n, (i + 1) * P)
                page[:b - a].copy_(src[a:b])
        slot.prev = self._last
        self._last = weakref.ref(slot)
        self.stats["offloaded"] += 1
        self.stats["bytes_to_host"] += n
        return slot

    # -- host -> device
    def _fetch(self, slot: _Slot) -> None:
        """Start the copy back (on the side stream on CUDA) and return the pages to the pool: later copies into
        them are queued on the same stream, after this one."""
        pages, slot.pages = slot.pages, None
        n, P = slot.nbytes, self.page_bytes
        if slot.device.type == "cuda":
            stream = self._stream(slot.device)
            with torch.cuda.stream(stream):
                out = torch.empty(slot.shape, dtype=slot.dtype, device=slot.device)
                dst = self._bytes(out)
                for i, page in enumerate(pages):
                    a, b = i * P, min(n, (i + 1) * P)
                    dst[a:b].copy_(page[:b - a], non_blocking=True)
                slot.ready = torch.cuda.Event()
                slot.ready.record(stream)
        else:
            out = torch.empty(slot.shape, dtype=slot.dtype, device=slot.device)
            dst = self._bytes(out)
            for i, page in enumerate(pages):
                a, b = i * P, min(n, (i + 1) * P)
                dst[a:b].copy_(page[:b - a])
        slot.fetched = out
        self._free.extend(pages)
        self.stats["bytes_to_device"] += n

    def _unpack(self, slot: _Slot) -> torch.Tensor:
        if slot.fetched is None:
            if slot.pages is None:
                raise RuntimeError("an offloaded checkpoint was unpacked twice")
            self.stats["late"] += 1
            self._fetch(slot)
        out, slot.fetched = slot.fetched, None
        if out.is_cuda:
            cur = torch.cuda.current_stream(out.device)
            cur.wait_event(slot.ready)
            out.record_stream(cur)  # allocated on the side stream, used (and freed) on this one
        prev = slot.prev() if slot.prev is not None else None
        if prev is not None and prev.pages is not None and prev.fetched is None:
            self._fetch(prev)  # the layer below is recomputed next: bring its checkpoint back meanwhile
            self.stats["prefetched"] += 1
        return out


def checkpointed_layers(model) -> list:
    """Modules of ``model`` (PEFT / DeepSpeed wrappers looked through) that transformers checkpoints: those with a
    true ``gradient_checkpointing`` attribute (the decoder layers, and in older transformers the decoder)."""
    from .loss import causal_lm_of

    return compat.checkpointed_modules(causal_lm_of(model))


def enable_checkpoint_offload(model, offloader: CheckpointOffloader | None = None) -> CheckpointOffloader:
    """Route every checkpointed layer of ``model`` (gradient checkpointing already enabled, e.g. by
    :func:`ropescale.training.model.add_lora`) through ``offloader``. Returns the offloader."""
    layers = checkpointed_layers(model)
    if not layers:
        raise InputError("--offload-checkpoints: the model has no gradient-checkpointed layer (enable gradient "
                         "checkpointing first)")
    off = offloader or CheckpointOffloader()
    fn = off.checkpoint_fn()
    for m in layers:
        compat.set_checkpoint_function(m, fn)
    return off


# ---------------------------------------------------------------- tiled MLP
def _autocast_state(device_type: str) -> list[tuple[str, bool, torch.dtype]]:
    out = []
    for dt in dict.fromkeys(("cpu", device_type)):
        try:
            out.append((dt, torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt)))
        except (RuntimeError, TypeError):  # a device type without autocast
            continue
    return out


@contextlib.contextmanager
def _replay_context(autocast_state, rng_state, device: torch.device):
    """Autocast as in the forward, and the RNG where the forward's chunks started (dropout masks match)."""
    cpu_rng, dev_rng = rng_state
    devices = [device] if device.type == "cuda" else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=devices, device_type="cuda"))
        torch.set_rng_state(cpu_rng)
        if dev_rng is not None:
            torch.cuda.set_rng_state(dev_rng, device)
        for dt, enabled, dtype in autocast_state:
            stack.enter_context(torch.amp.autocast(dt, enabled=enabled, dtype=dtype))
        yield


class _TiledMLP(torch.autograd.Function):
    """``fn`` (a position-wise MLP) over chunks of ``chunk`` rows of x (flattened to (rows, hidden)): forward keeps
    only x; backward recomputes one chunk at a time. The trained parameters of the MLP either come in as inputs
    (their gradients are summed over the chunks and returned: one accumulation, which DDP and ZeRO-1/2 expect) or,
    under ZeRO-3 (partitioned parameters cannot be inputs), are listed in ``zero3_params``: then every chunk's
    backward accumulates into them and DeepSpeed reduces only after the last chunk (``ds_grad_is_ready``)."""

    @staticmethod
    def forward(ctx, fn, chunk, zero3_params, x, *params):
        ctx.fn, ctx.chunk, ctx.zero3_params = fn, chunk, zero3_params
        ctx.params = params
        ctx.autocast = _autocast_state(x.device.type)
        ctx.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.is_cuda else None)
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        out = None
        for s in range(0, flat.shape[0], chunk):
            o = fn(flat[s:s + chunk])
            if out is None:
                out = o.new_empty((flat.shape[0], o.shape[-1]))
            out[s:s + o.shape[0]] = o
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        fn, chunk, params, zero3 = ctx.fn, ctx.chunk, ctx.params, ctx.zero3_params
        need_x = ctx.needs_input_grad[3]
        flat = x.detach().reshape(-1, x.shape[-1])
        g = grad_out.reshape(-1, grad_out.shape[-1])
        x_grad = torch.empty_like(flat) if need_x else None
        p_grads: list[torch.Tensor | None] = [None] * len(params)
        starts = list(range(0, flat.shape[0], chunk))
        with torch.enable_grad(), _replay_context(ctx.autocast, ctx.rng, x.device):
            for i, s in enumerate(starts):
                xc = flat[s:s + chunk].detach().requires_grad_(need_x)
                if zero3:
                    compat.defer_zero3_reduce(zero3, ready=i == len(starts) - 1)
                oc = fn(xc)
                gc = g[s:s + oc.shape[0]]
                if zero3:
                    torch.autograd.backward(oc, gc)
                    if need_x:
                        x_grad[s:s + oc.shape[0]] = xc.grad
                    continue
                want = ([xc] if need_x else []) + list(params)
                grads = torch.autograd.grad(oc, want, gc, allow_unused=True)
                if need_x:
                    x_grad[s:s + oc.shape[0]] = grads[0]
                    grads = grads[1:]
                for k, gp in enumerate(grads):
                    if gp is not None:
                        gp = gp.float()
                        p_grads[k] = gp if p_grads[k] is None else p_grads[k].add_(gp)
        p_out = [None if gp is None else gp.to(p.dtype) for gp, p in zip(p_grads, params)]
        return (None, None, None, None if x_grad is None else x_grad.view_as(x), *p_out)


def _tiled_forward(mlp, orig, chunk: int):
    def forward(x, *args, **kwargs):
        if args or kwargs or not torch.is_tensor(x) or x.dim() < 2:
            return orig(x, *args, **kwargs)
        rows = x.numel() // max(1, x.shape[-1])
        if rows <= chunk:
            return orig(x)
        trained = [p for p in mlp.parameters() if p.requires_grad]
        if torch.is_grad_enabled() and (x.requires_grad or trained):
            zero3 = [p for p in trained if compat.is_zero3_param(p)]
            if zero3:
                return _TiledMLP.apply(orig, chunk, zero3, x)
            return _TiledMLP.apply(orig, chunk, None, x, *trained)
        flat = x.reshape(-1, x.shape[-1])  # no graph to build: just chunk the forward
        out = None
        for s in range(0, rows, chunk):
            o = orig(flat[s:s + chunk])
            if out is None:
                out = o.new_empty((rows, o.shape[-1]))
            out[s:s + o.shape[0]] = o
        return out.view(*x.shape[:-1], out.shape[-1])

    forward._ropescale_tiled = chunk
    return forward


def decoder_mlps(model) -> list:
    """The MLP module of every decoder layer (``layer.mlp`` of Llama / Qwen2 / Mistral layers)."""
    from .loss import causal_lm_of

    out = []
    for m in causal_lm_of(model).modules():
        mlp = getattr(m, "mlp", None)
        if isinstance(mlp, torch.nn.Module) and type(m).__name__.endswith(("DecoderLayer", "Block", "Layer")):
            out.append(mlp)
    return out


def enable_tiled_mlp(model, chunk: int) -> int:
    """Compute every decoder layer's MLP over ``chunk``-token chunks (see :class:`_TiledMLP`); chunk 0 restores
    the plain MLP. Returns the number of MLPs changed."""
    mlps = decoder_mlps(model)
    if not mlps and chunk:
        raise InputError(f"--tile-mlp: no decoder layer with an `mlp` module in {type(model).__name__}")
    for mlp in mlps:
        if "_ropescale_own_forward" in mlp.__dict__:  # tiled before: start from the MLP's own forward
            own = mlp.__dict__.pop("_ropescale_own_forward")
            if own is None:
                mlp.__dict__.pop("forward", None)
            else:
                mlp.forward = own
        if chunk:
            mlp._ropescale_own_forward = mlp.__dict__.get("forward")  # None: the class's forward
            mlp.forward = _tiled_forward(mlp, mlp.forward, int(chunk))
    return len(mlps)


# ---------------------------------------------------------------- one entry point for finetune
@dataclass
class MemoryPlan:
    """What :func:`setup_memory` switched on, for the log and the training log records."""

    offload_checkpoints: bool = False
    tile_mlp: int = 0
    tokens: int = 0
    checkpoint_bytes: int = 0  # of one micro-batch, all layers
    host_pool_bytes: int = 0  # what the offload pool reaches (whole pages)
    host_available_bytes: int | None = None
    offloader: CheckpointOffloader | None = field(default=None, repr=False)

    def record(self) -> dict:
        r = {"offload_checkpoints": self.offload_checkpoints, "tile_mlp": self.tile_mlp}
        if self.offloader is not None:
            r["offload_host_mb"] = round(self.offloader.host_bytes / 2**20, 3)
        return r

    def describe(self) -> str:
        parts = []
        if self.offload_checkpoints:
            parts.append(f"checkpoints offloaded to {'pinned ' if self.offloader and self.offloader.pin else ''}"
                         f"host memory ({gib(self.host_pool_bytes)} for {self.tokens:,} tokens"
                         + (f", {gib(self.host_available_bytes)} available" if self.host_available_bytes else "")
                         + ")")
        else:
            parts.append("checkpoints on the device")
        parts.append(f"MLP tiled over {self.tile_mlp}-token chunks" if self.tile_mlp else "MLP not tiled")
        return ", ".join(parts)


def setup_memory(model, args, *, tokens: int, cuda: bool, dtype: torch.dtype, ds_config: dict | None = None,
                 available: int | None = None, page_bytes: int | None = None, quiet: bool = False) -> MemoryPlan:
    """Apply ``args.offload_checkpoints`` / ``args.tile_mlp`` (and ``args.gradient_checkpointing``) to the
    trained ``model`` (PEFT-wrapped or not; gradient checkpointing already enabled by ``add_lora``). ``tokens``:
    the longest micro-batch (micro batch x longest sample); ``dtype``: the residual stream's (the compute dtype).
    Raises InputError before any training when host memory cannot hold the offloaded checkpoints. The plan is
    also kept as ``model._ropescale_memory`` (the trainer logs it)."""
    from .loss import causal_lm_of

    lm = causal_lm_of(model)
    cfg = compat.text_config(lm.config)
    hidden, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    gc = bool(getattr(args, "gradient_checkpointing", True))
    offload = resolve_offload(getattr(args, "offload_checkpoints", "auto"), cuda=cuda, gradient_checkpointing=gc,
                              tokens=tokens)
    tile = resolve_tile(getattr(args, "tile_mlp", None), cuda=cuda, tokens=tokens, hidden=hidden)
    esize = torch.empty((), dtype=dtype).element_size()
    per_layer = int(tokens) * hidden * esize
    plan = MemoryPlan(offload_checkpoints=offload, tile_mlp=tile, tokens=int(tokens),
                      checkpoint_bytes=checkpoint_bytes(layers, tokens, hidden, esize))
    if offload:
        page = int(page_bytes or min(PAGE_BYTES, 1 << max(12, (per_layer - 1).bit_length())))
        plan.host_pool_bytes = pool_bytes(layers, tokens, hidden, esize, page)
        trainable = sum(compat.param_numel(p) for p in model.parameters() if p.requires_grad)
        extra = ds_offload_extra(ds_config, trainable)
        plan.host_available_bytes = check_host_memory(
            plan.host_pool_bytes, what=f"offloading the checkpoints of {layers} layers x {tokens:,} tokens x "
            f"{hidden} x {esize} bytes", extra=extra, extra_what="DeepSpeed's offloaded optimizer states",
            available=available, processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        plan.offloader = enable_checkpoint_offload(model, CheckpointOffloader(page_bytes=page, pin=cuda))
    if tile:
        enable_tiled_mlp(model, tile)
    model._ropescale_memory = plan
    if not quiet:
        log(f"[finetune] memory: {plan.describe()}")
    return plan
