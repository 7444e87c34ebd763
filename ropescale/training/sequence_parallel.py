"""Sequence parallelism: one sample split over K processes (DeepSpeed Ulysses, as in ALST), ``--sequence-parallel K``.

With W = K x D processes, ranks gK .. gK+K-1 form sequence group g (DeepSpeed's ``parallel_state_sp`` groups:
contiguous ranks, so a group stays on one node when K divides the GPUs per node) and the D groups do data
parallelism. A training step, per group:

- data: the trainer's sampler is sharded over the D groups instead of the W ranks, so every rank of a group draws
  the same micro-batch (:func:`shard_data_over_groups`); the global batch is micro batch x D x accumulation.
- batch: :class:`ShardCollator` pads the micro-batch to a multiple of K (pad id, label -100, at the END, where
  causal attention keeps pads unseen by the real tokens), shifts the labels BEFORE splitting (position t's target
  is token t+1, which may sit on the next rank), and gives rank k the k-th slice of the input ids, the shifted
  labels and the GLOBAL position ids (:func:`shard_batch`).
- attention: DeepSpeed's ``UlyssesSPAttentionHF`` replaces the model's attention function (:func:`register_attention`):
  an all-to-all turns (T/K tokens, all heads) into (T tokens, heads/K), the core attention (sdpa, flash) runs
  over the whole sequence, and a second all-to-all turns the result back; so the heads and the KV heads must
  divide by K (:func:`check_settings`). It is registered on the plain model, before PEFT wraps it (registering a
  PeftModel crashes: DeepSpeed issue #7729).
- RoPE: each shard rotates with its global positions, and a rule whose frequencies depend on the sequence length
  (dynamic NTK, longrope) sees the length of the whole sample, as without sequence parallelism
  (:func:`install_global_rope`, :func:`global_rope_length`).
- loss: each rank runs the label-only head on the labelled positions of its shard (``ropescale.training.loss``).
  The trainer divides each rank's CE sum by the step's labelled-token count ``num_items_in_batch``, which HF counts
  on each rank's ``shift_labels`` and sums over the W ranks (so each labelled token counts once), and multiplies by
  W; DeepSpeed averages the gradients over the W ranks.

DeepSpeed is NOT given the sequence groups (no ``mpu``): it treats the W ranks as W data-parallel ranks. That is
exact: each rank's backward carries the gradient of the positions it holds (the all-to-all's backward sends the
other ranks' shares home), so the mean over W of (W x CE sum of a shard / step count) is the gradient of the
step's token-mean loss, the same as one process computes. ZeRO partitions over all W ranks, and the checkpoints
have the layout of a W-rank data-parallel run (DeepSpeed would name them per "model-parallel" rank given an mpu).

Every reliance on a DeepSpeed / accelerate internal is in one small function below, with the versions it was
written against (deepspeed 0.19.8, accelerate 1.15.0, transformers 5.24.0).
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
from dataclasses import dataclass

from data_concat.packed import IGNORE_INDEX
from ropescale.common.compat.rope import global_length, install_global_length, rotary_embedding_modules
from ropescale.common.io import InputError

from .positions import PAD_SEGMENT

VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")  # document attention's segments
SHARD_KEYS = ("position_ids", "shift_labels", "max_position", *VARLEN_KEYS)  # a shard's keys beyond ids/labels/mask
COVERAGE_KEY = "whole_batch"  # on a group's first rank: the micro-batch before the split (its position coverage)


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: ``degree`` K ranks per sequence group, ``world`` W ranks in all."""

    degree: int
    world: int
    rank: int

    @property
    def groups(self) -> int:
        """D: the number of sequence groups (the data-parallel degree)."""
        return self.world // self.degree

    @property
    def group(self) -> int:
        """This rank's sequence group (its data-parallel index)."""
        return self.rank // self.degree

    @property
    def sp_rank(self) -> int:
        """This rank's place in its group: it holds the ``sp_rank``-th slice of each sample."""
        return self.rank % self.degree


# The releases with which two processes under --sequence-parallel 2 were checked to train what one process trains
# (tests/test_sequence_parallel.py). At pyproject's lower bounds (transformers 5.13, accelerate 1.3, deepspeed 0.19.3)
# the same test gave losses 0.026 and weights 5.9e-3 apart (make compat, 2026-11-25), so older releases are refused.
VERIFIED = {"transformers": (5, 24), "accelerate": (1, 15), "deepspeed": (0, 19, 8)}


def unverified_versions() -> list[str]:
    """``name version`` of each installed release below :data:`VERIFIED` (empty: sequence parallelism may run)."""
    from ropescale.common.compat import version

    return [f"{d} {'.'.join(map(str, version(d)))}" for d, v in VERIFIED.items() if version(d) and version(d) < v]


def check_settings(k: int, *, config, world: int, deepspeed, attn: str, policy=None) -> None:
    """Refuse (InputError, one line) what sequence parallelism of degree ``k`` cannot run, before any model is
    loaded: document attention (``policy``, a ``positions.Policy``: its varlen kernel) with another attention than SDPA,
    no DeepSpeed config or package, a launch whose process count is not a multiple of ``k``,
    attention heads or KV heads that do not divide by ``k``, eager attention, releases older than
    :data:`VERIFIED`."""
    if k <= 1:
        return
    flag = f"--sequence-parallel {k}"
    if policy is not None and policy.varlen_kernel(k) and attn != "sdpa":
        raise InputError(f"{flag} with --attention document runs with --attn sdpa only (each segment's attention "
                         f"over the gathered sequence: doc_mask.VARLEN_SDPA), not {attn}")
    if not deepspeed:
        raise InputError(f"{flag} runs under DeepSpeed: add --deepspeed zero3_offload (or zero2, zero2_offload, "
                         f"zero3, a JSON file)")
    if importlib.util.find_spec("deepspeed") is None:
        raise InputError(f"{flag} needs the deepspeed package (pip install -r requirements-deepspeed.txt)")
    if world < k or world % k:
        raise InputError(f"{flag} needs a multiple of {k} processes and this launch has {world}: start it with "
                         f"`deepspeed --num_gpus {k} finetune.py ...` (or a multiple of {k} GPUs)")
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    if heads % k or kv % k:
        raise InputError(f"{flag}: the model's {heads} attention heads and {kv} KV heads must both divide by {k} "
                         f"(Ulysses gives each process heads/{k} of them); pick a K that divides {math.gcd(heads, kv)}")
    if attn == "eager":
        raise InputError(f"{flag} needs --attn sdpa or flash_attention_2 (eager attention builds a full 4D mask, "
                         f"which Ulysses cannot split)")
    old = unverified_versions()
    if old:
        want = ", ".join(f"{d}>={'.'.join(map(str, v))}" for d, v in VERIFIED.items())
        raise InputError(f"{flag} is verified to train what one process trains only with {want}; this environment has "
                         f"{', '.join(old)} (install requirements.lock)")


# ---------------------------------------------------------------- the model
def register_attention(model, layout: Layout, micro_batch: int):
    """deepspeed 0.19.8 (ALST, >= 0.18.1), transformers 5.24 (``config._attn_implementation``):
    ``UlyssesSPAttentionHF.register_with_transformers`` builds the sequence
    groups (``deepspeed.runtime.sequence_parallel.parallel_state_sp``: ranks gK .. gK+K-1) and puts its all-to-all
    wrapper in place of the model's attention function in transformers' ``ALL_ATTENTION_FUNCTIONS`` (for the whole
    process). Call it on the plain HF model, before ``get_peft_model`` (DeepSpeed #7729). Returns DeepSpeed's
    group module (not given to ``deepspeed.initialize``: see the module doc)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=model.config._attn_implementation,
        sequence_parallel_size=layout.degree, micro_batch_size=micro_batch, seq_length_is_variable=True)
    got = (mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_world_size())
    if got != (layout.sp_rank, layout.degree):  # the data split below assumes DeepSpeed's contiguous groups
        raise RuntimeError(f"DeepSpeed's sequence group puts rank {layout.rank} at {got}, expected "
                           f"{(layout.sp_rank, layout.degree)}")
    return mpu


def install_global_rope(model) -> int:
    """Let each rotary module of ``model`` (one, or one per layer type: ``compat.rope.rotary_embedding_modules``)
    rotate a shard as part of the whole sample: inside :func:`global_rope_length` (``max_position`` = the sample's
    last position) a rule that reads the length from the positions (transformers' ``dynamic_rope_update``:
    ``max(position_ids) + 1`` for dynamic NTK and longrope; this repo's dynamic YaRN) sees the whole sample's length
    on every rank (``compat.rope.install_global_length``); for the other rules cos/sin are functions of each
    position alone, unchanged. Returns the number of modules."""
    return install_global_length(rotary_embedding_modules(model))


@contextlib.contextmanager
def global_rope_length(model, max_position):
    """Inside: the rotary modules installed by :func:`install_global_rope` take ``max_position`` as the sample's
    last position (None: as the positions they are given)."""
    with global_length(rotary_embedding_modules(model), max_position):
        yield


def setup_model(model, layout: Layout, micro_batch: int, varlen: bool = False):
    """Sequence parallelism on the plain (not yet PEFT-wrapped) model: the Ulysses attention and the global RoPE
    length; with ``varlen`` (document attention: ``positions.Policy.varlen_kernel``) the core attention behind
    Ulysses is ``doc_mask.VARLEN_SDPA``,
    which runs SDPA causally inside each segment of the gathered sequence (the segments' varlen arguments ride
    in every shard: :func:`shard_batch`). Returns DeepSpeed's group module."""
    if varlen:
        from .doc_mask import use_varlen_sdpa  # torch

        use_varlen_sdpa(model)
    mpu = register_attention(model, layout, micro_batch)
    install_global_rope(model)
    return mpu


# ---------------------------------------------------------------- the data
def shard_batch(batch: dict, k: int, rank: int, pad_id: int, rows: int = 0) -> dict:
    """Rank ``rank``'s shard of a collated micro-batch ({input_ids, labels[, attention_mask]}, right-padded):
    padded to a multiple of ``k`` at the end (``pad_id``, label -100) and to ``rows`` rows (rows of pads only: the
    last micro-batch of an epoch may be short, and the Ulysses attention is built for a fixed batch size), labels
    shifted by one BEFORE the split (``shift_labels[t]`` = the target of position t), global ``position_ids``
    (0 .. T'-1 over the padded length), ``attention_mask`` (1 on real tokens: what the trainer counts; the model runs
    without a mask) and ``max_position`` = the unpadded length - 1 (what the model sees as the sample's last
    position). transformers 5.24: the Trainer counts ``num_items_in_batch`` on ``shift_labels`` when a batch has
    them (``Trainer._get_num_items_in_batch``), so each labelled target is counted once, on the rank scoring it.

    A batch of a positions policy (``ropescale.training.data``): its ``position_ids`` (PoSE, reset) are sharded
    instead of 0 .. T'-1 (the padding gets 0) and ``max_position`` is their largest; its ``segment_ids`` (document
    attention) become the varlen arguments of the whole padded batch (``doc_mask.varlen_kwargs``: the padding a
    segment of its own), the same in every shard, for the core attention that sees the gathered sequence."""
    import torch
    import torch.nn.functional as F

    from .doc_mask import varlen_kwargs  # torch

    ids, labels = batch["input_ids"], batch["labels"]
    b, t = ids.shape
    real = batch.get("attention_mask")
    if real is None:
        real = torch.ones_like(ids)
    padded = -(-t // k) * k
    extra, more = padded - t, max(0, rows - b)
    ids = F.pad(ids, (0, extra, 0, more), value=pad_id)
    real = F.pad(real, (0, extra, 0, more), value=0)
    shift = F.pad(labels[:, 1:], (0, extra + 1, 0, more), value=IGNORE_INDEX)
    given = batch.get("position_ids")
    if given is None:
        pos, top = torch.arange(padded, dtype=torch.long).unsqueeze(0).expand(b + more, padded), t - 1
    else:
        pos, top = F.pad(given, (0, extra, 0, more), value=0), int(given.max())
    n = padded // k
    s = slice(rank * n, (rank + 1) * n)
    shard_labels = shift[:, s].contiguous()
    out = {"input_ids": ids[:, s].contiguous(), "labels": shard_labels, "shift_labels": shard_labels,
           "position_ids": pos[:, s].contiguous(), "attention_mask": real[:, s].contiguous(), "max_position": top}
    if batch.get("segment_ids") is not None:
        out.update(varlen_kwargs(F.pad(batch["segment_ids"], (0, extra, 0, more), value=PAD_SEGMENT)))
    return out


class ShardCollator:
    """``collate`` (the usual right-padding collator), then this rank's shard (:func:`shard_batch`) of a batch of
    ``micro_batch`` rows; on the group's first rank also the whole collated batch (:data:`COVERAGE_KEY`)."""

    def __init__(self, collate, layout: Layout, pad_id: int, micro_batch: int = 1):
        self.collate = collate
        self.layout = layout
        self.pad_id = int(pad_id)
        self.micro_batch = int(micro_batch)

    def __call__(self, batch: list[dict]) -> dict:
        whole = self.collate(batch)
        shard = shard_batch(whole, self.layout.degree, self.layout.sp_rank, self.pad_id, rows=self.micro_batch)
        if self.layout.sp_rank == 0:  # the group's first rank counts what the group trains (trainer coverage)
            shard[COVERAGE_KEY] = whole
        return shard


def shard_data_over_groups(dataloader, layout: Layout) -> None:
    """accelerate 1.15 / transformers 5.24: the Trainer's train DataLoader comes out of ``accelerator.prepare``
    with an ``accelerate.data_loader.BatchSamplerShard`` that deals the batches round-robin over the W processes.
    Make it deal over the D sequence groups instead, so every rank of a group gets the group's batches (the same
    move transformers makes for its ``BatchRebalanceSampler``). A later ``skip_first_batches`` (resume) wraps this
    same object."""
    if layout.world == 1:
        return
    from accelerate.data_loader import BatchSamplerShard

    bs = getattr(dataloader, "batch_sampler", None)
    if not isinstance(bs, BatchSamplerShard):
        raise RuntimeError(f"sequence parallelism: the train DataLoader's batch sampler is {type(bs).__name__}, not "
                           f"accelerate's BatchSamplerShard; this accelerate version is not supported")
    bs.num_processes = layout.groups
    bs.process_index = layout.group


def describe(layout: Layout) -> str:
    return (f"sequence parallel {layout.degree} (Ulysses): {layout.groups} group(s) of {layout.degree} processes, "
            f"each sample split in {layout.degree}")
