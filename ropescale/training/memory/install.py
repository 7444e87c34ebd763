"""The memory plan applied to a model: finetune's memory flags read into a plan's activation part (the ``recipe``
plan's auto rules), and :func:`setup_memory`, which sets which layers are recomputed, where their checkpoints live
(:mod:`.offload`), the tiled MLP (:mod:`.tiled_mlp`) and the layers tiled by sequence (:mod:`.tiled_attention`)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch

from ropescale.common import compat
from ropescale.common.forward_memory import gib
from ropescale.common.io import InputError
from ropescale.common.process import is_main

from ..model import causal_lm_of
from .estimate import AUTO_MIN_TOKENS, Activations, layer_roles, ordinal
from .offload import (
    PAGE_BYTES,
    CheckpointOffloader,
    check_host_memory,
    checkpoint_bytes,
    ds_offload_extra,
    enable_checkpoint_offload,
    pool_bytes,
)
from .tiled_attention import enable_tiled_attention
from .tiled_mlp import checkpointed_layers, enable_tiled_mlp, innermost_layers


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
    return _int_or(value, int(hidden) if cuda and tokens >= AUTO_MIN_TOKENS else 0, "--tile-mlp",
                   "a number of tokens, 0 (off) or auto")


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
    recompute_every: int = 1  # every k-th layer recomputed (0: none)
    checkpoint_block: int = 1  # one stored checkpoint per block of k layers
    gpu_checkpoints: int = 0  # offloaded: stored checkpoints kept on the device
    tile_attention: int = 0  # each recomputed layer by sequence chunks of N tokens (tiled_attention)
    roles: list = field(default_factory=list, repr=False)
    offloader: CheckpointOffloader | None = field(default=None, repr=False)

    def count(self, role: str) -> int:
        return sum(1 for r, _ in self.roles if r == role)

    def record(self) -> dict:
        r = {"offload_checkpoints": self.offload_checkpoints, "tile_mlp": self.tile_mlp}
        if self.tile_attention:
            r["tile_attention"] = self.tile_attention
        if self.roles:
            r.update(recompute_every=self.recompute_every, checkpoint_block=self.checkpoint_block,
                     gpu_checkpoints=self.count("gpu"), host_checkpoints=self.count("host"))
        if self.offloader is not None:
            r["offload_host_mb"] = round(self.offloader.host_bytes / 2**20, 3)
        return r

    def describe(self) -> str:
        parts = []
        if self.roles and self.recompute_every != 1:
            parts.append("no layer recomputed" if not self.recompute_every else
                         f"{len(self.roles) - self.count('none')} of {len(self.roles)} layers recomputed (every "
                         f"{ordinal(self.recompute_every)})")
        if self.checkpoint_block > 1:
            parts.append(f"one checkpoint per {self.checkpoint_block} layers")
        if self.offload_checkpoints:
            kept = self.count("gpu")
            parts.append((f"{kept} checkpoints on the device, {self.count('host')}" if kept else "checkpoints")
                         + " offloaded to "
                         f"{'pinned ' if self.offloader and self.offloader.pin else ''}host memory "
                         f"({gib(self.host_pool_bytes)} for {self.tokens:,} tokens"
                         + (f", {gib(self.host_available_bytes)} available" if self.host_available_bytes else "")
                         + ")")
        elif self.recompute_every:
            parts.append("checkpoints on the device")
        parts.append(f"each recomputed layer over {self.tile_attention}-token sequence chunks" if self.tile_attention
                     else f"MLP tiled over {self.tile_mlp}-token chunks" if self.tile_mlp else "MLP not tiled")
        return ", ".join(parts)


def _int_or(value, default: int, flag: str, what: str = "a whole number or auto") -> int:
    """A flag that takes a whole number >= 0 or ``auto`` (None too: ``default``); InputError otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} must be {what}, not {value!r}") from None
    if n < 0:
        raise InputError(f"{flag} must be >= 0, got {n}")
    return n


def plan_from_args(args, *, cuda: bool, tokens: int, hidden: int) -> Activations:
    """The activation part of the ``recipe`` plan from finetune's flags with the old auto rules: checkpoint offload
    and MLP tiling from :data:`AUTO_MIN_TOKENS` tokens on CUDA, every layer recomputed, one checkpoint per layer,
    none kept on the device; the flags given override each."""
    gc = bool(getattr(args, "gradient_checkpointing", True))
    offload = resolve_offload(getattr(args, "offload_checkpoints", "auto"), cuda=cuda, gradient_checkpointing=gc,
                              tokens=tokens)
    return Activations(recompute_every=_int_or(getattr(args, "recompute_every", None), 1, "--recompute-every")
                       if gc else 0,
                       checkpoint_block=max(1, _int_or(getattr(args, "checkpoint_block", None), 1,
                                                       "--checkpoint-block")),
                       offload_checkpoints=offload,
                       gpu_checkpoints=_int_or(getattr(args, "gpu_checkpoints", None), 0, "--gpu-checkpoints"),
                       tile_mlp=resolve_tile(getattr(args, "tile_mlp", None), cuda=cuda, tokens=tokens,
                                             hidden=hidden),
                       tile_attention=_int_or(getattr(args, "tile_attention", None), 0, "--tile-attention"))


def setup_memory(model, args, *, max_len: int, cuda: bool, dtype: torch.dtype, ds_config: dict | None = None,
                 available: int | None = None, page_bytes: int | None = None, quiet: bool | None = None,
                 plan=None) -> MemoryPlan:
    """Apply a memory plan's activation part to the trained ``model`` (PEFT-wrapped or not; gradient checkpointing
    already enabled by ``add_lora``): which layers are recomputed (``plan.recompute_every``), one stored checkpoint
    per layer or per block, stored checkpoints on the device or in host memory (the top ``gpu_checkpoints`` kept on
    the device), the tiled MLP. ``plan``: a ``ropescale.training.memory.plan.Plan`` or :class:`Activations`; None =
    from ``args`` (:func:`plan_from_args`). ``max_len``: the longest sample one process holds (its micro-batch,
    ``args.micro_batch`` x ``max_len`` tokens, is what the plan is sized for);
    ``dtype``: the residual stream's (the compute dtype). Raises InputError before any training when host memory
    cannot hold the offloaded checkpoints. The plan is also kept as ``model._ropescale_memory`` (the trainer logs
    it). ``quiet`` None: quiet on every process but the main one. Call after ``model.add_lora`` (which enables
    gradient checkpointing) and before the Trainer is built."""
    tokens = int(getattr(args, "micro_batch", 1) or 1) * int(max_len)
    lm = causal_lm_of(model)
    cfg = compat.text_config(lm.config)
    hidden, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    if plan is None:
        plan = plan_from_args(args, cuda=cuda, tokens=tokens, hidden=hidden)
    if plan.offload_checkpoints and not plan.recompute_every:
        raise InputError("--offload-checkpoints true needs recomputed layers (--recompute-every >= 1): without "
                         "recompute there are no checkpoints to offload")
    esize = torch.empty((), dtype=dtype).element_size()
    per_layer = int(tokens) * hidden * esize
    roles = layer_roles(layers, recompute_every=plan.recompute_every, block=plan.checkpoint_block,
                        offload=plan.offload_checkpoints, gpu_checkpoints=plan.gpu_checkpoints)
    mp = MemoryPlan(offload_checkpoints=plan.offload_checkpoints, tile_mlp=int(plan.tile_mlp), tokens=int(tokens),
                    checkpoint_bytes=checkpoint_bytes(layers, tokens, hidden, esize),
                    recompute_every=plan.recompute_every, checkpoint_block=plan.checkpoint_block if
                    plan.recompute_every == 1 else 1, gpu_checkpoints=plan.gpu_checkpoints, roles=roles,
                    tile_attention=int(getattr(plan, "tile_attention", 0) or 0))
    hosted = mp.count("host")
    page = PAGE_BYTES
    if hosted:
        page = int(page_bytes or min(PAGE_BYTES, 1 << max(12, (per_layer - 1).bit_length())))
        mp.host_pool_bytes = pool_bytes(hosted, tokens, hidden, esize, page)
        trainable = sum(compat.param_numel(p) for p in model.parameters() if p.requires_grad)
        extra = ds_offload_extra(ds_config, trainable)
        mp.host_available_bytes = check_host_memory(
            mp.host_pool_bytes, what=f"offloading the checkpoints of {hosted} layers x {tokens:,} tokens x "
            f"{hidden} x {esize} bytes", extra=extra, extra_what="DeepSpeed's offloaded optimizer states",
            available=available, processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    off = None
    if hosted or mp.checkpoint_block > 1:
        off = enable_checkpoint_offload(model, CheckpointOffloader(page_bytes=page if hosted else PAGE_BYTES,
                                                                   pin=cuda), roles)
        mp.offloader = off if hosted else None
    elif mp.count("none"):  # selective recompute alone: the other layers are checkpointed as transformers does
        for m, (role, _) in zip(innermost_layers(checkpointed_layers(model)), roles):
            if role == "none":
                compat.set_layer_checkpointing(m, False)
    if plan.tile_mlp:
        enable_tiled_mlp(model, int(plan.tile_mlp))
    if mp.tile_attention:
        enable_tiled_attention(model, mp.tile_attention, roles, off)
    model._ropescale_memory = mp
    if not (quiet if quiet is not None else not is_main()):
        log(f"[finetune] memory: {mp.describe()}")
    return mp
