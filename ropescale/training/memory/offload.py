"""Checkpoints offloaded to pinned host memory (long samples on one GPU) and the host-RAM check.

Where the memory of a training step goes at long sequences (T tokens, Qwen1.5-7B shape: 32 layers, hidden 4096,
intermediate 11,008, bf16, gradient checkpointing on every decoder layer; the LM head is label-only and chunked,
:mod:`ropescale.training.loss`):

- the checkpoints: each decoder layer keeps its input for the recompute in backward, layers x T x hidden x 2 bytes
  = 256 KiB a token (2 GiB a layer and 64 GiB in all at 256K). :class:`CheckpointOffloader` copies each layer's
  input to pinned host memory on a side CUDA stream as soon as the layer has run (the GPU copy is freed once the
  copy is done), and brings it back on that stream while the layer above it is recomputed, so the copies overlap
  the compute. The GPU holds one or two checkpoints instead of all of them; host memory holds all of them:
  :func:`check_host_memory` refuses (one line, before training) when it cannot. The memory planner
  (:mod:`ropescale.training.memory.plan`) gives each layer a role (``estimate.layer_roles``): its input stored on
  the GPU (the top ones: backward needs them first) or on the host, recomputed from its block's stored input (blocks
  of k layers store one input; the others are rerun forward without grad, with the forward's autocast and RNG, when
  backward reaches the block), or not recomputed at all (``--recompute-every k``: its activations kept).
- the recompute of one layer in backward: besides attention, its MLP's intermediate activations (gate, up,
  act(gate), their product: 4 x T x intermediate x 2 bytes, 22 GiB at 256K). ``tiled_mlp.enable_tiled_mlp`` computes
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

import functools
import math
import weakref

import torch

from ropescale.common import compat
from ropescale.common.forward_memory import gib
from ropescale.common.host import available_host_bytes  # torch-free home; check_host_memory reads it here
from ropescale.common.io import InputError

from .estimate import HOST_HEADROOM
from .tiled_mlp import autocast_state, checkpointed_layers, innermost_layers, replay_context

PAGE_BYTES = 32 << 20  # pinned host pages of the checkpoint pool
DS_OFFLOAD_BYTES_PER_PARAM = 16  # DeepSpeed's offloaded optimizer: fp32 master + Adam m, v + fp32 grad per param


# ---------------------------------------------------------------- host memory
def checkpoint_bytes(layers: int, tokens: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of the checkpoints of one micro-batch: layers x tokens (micro batch x sequence) x hidden x dtype."""
    return int(layers) * int(tokens) * int(hidden) * int(dtype_bytes)


def pool_bytes(layers: int, tokens: int, hidden: int, dtype_bytes: int, page_bytes: int = PAGE_BYTES) -> int:
    """Host bytes the offload pool reaches: every layer's checkpoint in whole pages."""
    per_layer = int(tokens) * int(hidden) * int(dtype_bytes)
    return int(layers) * math.ceil(per_layer / page_bytes) * page_bytes


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


class _Kept:
    """A checkpoint that stays on the device (its unpack starts fetching the topmost one on the host)."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _Block:
    """The layers of one checkpoint block in this forward: the stored input of its first layer (a :class:`_Slot`
    or :class:`_Kept`), each layer's call (function, other arguments, autocast state, RNG state at its start) and
    the upper layers' inputs once recomputed in backward."""

    __slots__ = ("input", "calls", "cache", "__weakref__")

    def __init__(self):
        self.input = None
        self.calls: list[tuple] = []
        self.cache: dict[int, torch.Tensor] = {}


class _Derived:
    """The input of the layer at ``pos`` > 0 of a block: not stored, recomputed from the block's input."""

    __slots__ = ("block", "pos")

    def __init__(self, block: _Block, pos: int):
        self.block, self.pos = block, pos


class CheckpointOffloader:
    """Moves each decoder layer's checkpoint to host memory and back (see module doc); with blocks, stores one
    input per block and recomputes the others in backward.

    ``page_bytes``: size of the host pages; ``pin``: page-locked pages (default: when CUDA is available). Counters
    in :attr:`stats`: checkpoints offloaded, bytes copied each way, prefetches issued, fetches that had to be
    started at unpack time (not prefetched) and layer forwards run again to recompute a block's inputs."""

    def __init__(self, page_bytes: int = PAGE_BYTES, pin: bool | None = None):
        self.page_bytes = int(page_bytes)
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self._free: list[torch.Tensor] = []
        self.pages_allocated = 0
        self._streams: dict = {}
        self._last: weakref.ref | None = None
        self._block: _Block | None = None  # the block the forward is in
        self._blocks = False  # whether any layer is a block's upper layer (enable_checkpoint_offload sets it)
        self.stats = {"offloaded": 0, "bytes_to_host": 0, "bytes_to_device": 0, "prefetched": 0, "late": 0,
                      "recomputed": 0}

    @property
    def host_bytes(self) -> int:
        """Host memory held by the pool (pages in use + free)."""
        return self.pages_allocated * self.page_bytes

    # -- the hook transformers calls
    def checkpoint_fn(self, base=None, role: str = "host", pos: int = 0):
        """A drop-in ``_gradient_checkpointing_func``: ``fn(function, *args, **kwargs)`` = torch's non-reentrant
        checkpoint of ``function(*args, **kwargs)`` whose checkpoint (the first positional argument, the hidden
        states) lives in host memory (``role`` host) or on the device (gpu) until its recompute, or is not stored
        but recomputed from its block's input (derived, at ``pos`` in the block). ``base``: the checkpoint function
        to wrap (default ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=False``)."""
        if base is None:
            from torch.utils.checkpoint import checkpoint

            base = functools.partial(checkpoint, use_reentrant=False)

        def offloaded_checkpoint(function, *args, **kwargs):
            x = args[0] if args and torch.is_tensor(args[0]) else None
            if x is None or not torch.is_grad_enabled() or not x.is_floating_point():
                return base(function, *args, **kwargs)
            blk = self._enter_block(function, args, kwargs, x, role, pos)
            with self.hooks(x, "host" if role == "derived" and blk is None else role, blk, pos):
                return base(function, *args, **kwargs)

        offloaded_checkpoint._ropescale_offloader = self
        return offloaded_checkpoint

    def _enter_block(self, function, args, kwargs, x, role: str, pos: int) -> _Block | None:
        """Record this layer's call in its block (a new block at pos 0); None outside blocks (or where the calls
        came out of order: the layer is then stored as any other)."""
        if role == "derived":
            blk = self._block
            if blk is None or len(blk.calls) != pos:
                return None
        elif pos == 0 and role in ("gpu", "host") and self._blocks:
            blk = self._block = _Block()
        else:
            return None
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.is_cuda else None)
        blk.calls.append((function, args[1:], kwargs, autocast_state(x.device.type), rng))
        return blk

    def hooks(self, target: torch.Tensor, role: str = "host", blk: _Block | None = None, pos: int = 0):
        """saved_tensors_hooks that store ``target`` (when it is saved) as ``role`` says and keep every other tensor
        as is."""

        # the hooks live as long as the saved tensor (autograd keeps them with it): no reference to target
        key = (target.data_ptr(), tuple(target.shape), target.dtype, target.device)

        def pack(t):
            if (t.data_ptr(), tuple(t.shape), t.dtype, t.device) != key:
                return t
            if role == "derived" and blk is not None:
                return _Derived(blk, pos)
            obj = self._pack(t) if role == "host" else _Kept(t)
            if blk is not None:
                blk.input = obj
            return obj

        def unpack(obj):
            if isinstance(obj, _Slot):
                return self._unpack(obj)
            if isinstance(obj, _Derived):
                return self._derive(obj)
            if isinstance(obj, _Kept):
                self._prefetch(self._last() if self._last is not None else None)
                return obj.t
            return obj

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

    def _prefetch(self, slot: _Slot | None) -> None:
        if slot is not None and slot.pages is not None and slot.fetched is None:
            self._fetch(slot)
            self.stats["prefetched"] += 1

    def _on_device(self, slot: _Slot) -> torch.Tensor:
        """The slot's tensor back on its device (fetched now where it was not prefetched), usable on the current
        stream; it stays in the slot."""
        if slot.fetched is None:
            if slot.pages is None:
                raise RuntimeError("an offloaded checkpoint was unpacked twice")
            self.stats["late"] += 1
            self._fetch(slot)
        out = slot.fetched
        if out.is_cuda:
            torch.cuda.current_stream(out.device).wait_event(slot.ready)
        return out

    def _unpack(self, slot: _Slot) -> torch.Tensor:
        out = self._on_device(slot)
        slot.fetched = None
        if out.is_cuda:
            out.record_stream(torch.cuda.current_stream(out.device))  # allocated on the side stream, freed here
        self._prefetch(slot.prev() if slot.prev is not None else None)  # the one backward needs next
        return out

    def _derive(self, d: _Derived) -> torch.Tensor:
        """The input of a block's upper layer: from the cache, or recomputed (no grad, the forward's autocast and
        RNG) from the block's stored input through the layers below it, the ones in between cached."""
        blk = d.block
        if d.pos in blk.cache:
            x = blk.cache.pop(d.pos)
        else:
            obj = blk.input
            x = self._on_device(obj) if isinstance(obj, _Slot) else obj.t
            with torch.no_grad():
                for i in range(d.pos):
                    function, rest, kwargs, autocast, rng = blk.calls[i]
                    with replay_context(autocast, rng, x.device):
                        out = function(x, *rest, **kwargs)
                    x = out[0] if isinstance(out, (tuple, list)) else out
                    if i + 1 < d.pos:
                        blk.cache[i + 1] = x
            self.stats["recomputed"] += d.pos
        if d.pos == 1:  # the block's lowest upper layer: nothing more to recompute (its first layer keeps its own)
            blk.input, blk.calls = None, []
        return x


def enable_checkpoint_offload(model, offloader: CheckpointOffloader | None = None, roles=None) -> CheckpointOffloader:
    """Route every checkpointed layer of ``model`` (gradient checkpointing already enabled, e.g. by
    :func:`ropescale.training.model.add_lora`) through ``offloader``: each layer as ``roles`` says
    (:func:`layer_roles`; default: every checkpoint to the host). A ``none`` layer is no longer checkpointed.
    Returns the offloader."""
    layers = checkpointed_layers(model)
    if not layers:
        raise InputError("--offload-checkpoints: the model has no gradient-checkpointed layer (enable gradient "
                         "checkpointing first)")
    if roles is None:
        roles = [("host", 0)] * len(layers)
    else:
        layers = innermost_layers(layers)
    if len(roles) != len(layers):
        raise InputError(f"the memory plan is for {len(roles)} checkpointed layers, the model has {len(layers)} "
                         "(a transformers release that checkpoints the whole decoder?)")
    off = offloader or CheckpointOffloader()
    off._blocks = any(r == "derived" for r, _ in roles)
    for m, (role, pos) in zip(layers, roles):
        if role == "none":
            compat.set_layer_checkpointing(m, False)
        else:
            compat.set_checkpoint_function(m, off.checkpoint_fn(role=role, pos=pos))
    return off
