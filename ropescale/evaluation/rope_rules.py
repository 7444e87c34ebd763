"""The hf backend's rotary rules that follow the length, per sample: each decode slot of the slot decoder
(:func:`slot_ropes`, :mod:`ropescale.evaluation.engine`) and each padded ``generate`` batch (:func:`longrope_for`,
:func:`longrope_groups`, :func:`reset_dynamic_ntk`), installed through the one rotary wrapper
(:mod:`ropescale.common.compat.rope`). A decode step under a per-slot rule runs eagerly, since the per-slot
frequencies need the positions on the host.

- dynamic NTK (``--rope dynamic_ntk``): transformers' rotary module recomputes its base from the largest position
  of a forward pass and keeps the largest it has seen (it only shrinks back below the original context), so a
  module that served a long sample would serve every later, shorter one with the long sample's base. Each sample
  is therefore computed as batch-1 ``generate`` on a fresh model computes it: the module is reset before every
  prefill (and every ``generate`` batch), and a decode step gives every slot the frequencies of its own length (the
  module's own code, run once per slot with that slot's frequencies), not those of the longest live slot.
- dynamic YaRN (``--rope dynamic_yarn``, this repo's rule: ``rope_scaling.load.install_rope_rule``): YaRN at s =
  max(1, L / orig) for the current length L, per slot in a decode step (the prefill's forward at the prompt's).
- LongRoPE (``--rope longrope``): one factor set per sample, chosen once (:func:`longrope_long`, here and nowhere
  else): the long factors when prompt + max new tokens > the original context, else the short ones; a slot keeps it
  from its prefill on, a padded batch holds samples of one set only. transformers switches per forward on the
  batch's largest position, which would give slots at different lengths one set, and a sample whose prompt fits the
  original context but whose generation passes it keys cached with short factors under queries with long ones
  (transformers avoids this only in Phi-3's ``prepare_inputs_for_generation``, by prefilling again at the
  crossing). Long factors from the prefill cost nothing extra and are what vLLM serves (its long factors for every
  token once max_model_len > orig).
"""
from __future__ import annotations

import contextlib
from typing import Sequence

from rope_scaling.formulas import REGISTRY
from ropescale.common.compat.rope import (
    dynamic_rope_modules,
    fixed_rope,
    length_rope_frequencies,
    length_rope_modules,
    longrope_frequencies,
    longrope_original_context,
    per_row_forward,
    reset_dynamic_rope,
    rope_frequencies,
    rope_frequencies_for_length,
    rotary_modules_of_type,
)

LONGROPE_TYPE = REGISTRY["longrope"].reads  # transformers' rope_type of a LongRoPE rotary module (short/long factors)


def reset_dynamic_ntk(model) -> None:
    """Put the model's dynamic-NTK rotary modules back in their freshly loaded state
    (:func:`ropescale.common.compat.rope.reset_dynamic_rope`)."""
    reset_dynamic_rope(dynamic_rope_modules(model))


# ---------------------------------------------------------------- LongRoPE's factor set, per sample
def longrope_modules(model) -> list:
    """The model's rotary modules of transformers' LongRoPE type (:data:`LONGROPE_TYPE`)."""
    return rotary_modules_of_type(model, LONGROPE_TYPE)


def longrope_long(module, total: int) -> bool:
    """Whether a sample of at most ``total`` tokens (prompt + generation budget) runs with a ``longrope`` module's
    long factors: past its original context (:func:`ropescale.common.compat.rope.longrope_original_context`)."""
    return int(total) > longrope_original_context(module)


def longrope_factors(module, total: int):
    """(inv_freq, attention_scaling) a ``longrope`` module runs a sample of at most ``total`` tokens with
    (:func:`longrope_long`), on the module's device."""
    return longrope_frequencies(module, next(module.buffers()).device, longrope_long(module, total))


@contextlib.contextmanager
def longrope_for(model, total: int):
    """Inside: every ``longrope`` module of ``model`` uses one factor set, the one a sample of at most ``total``
    tokens takes (:func:`longrope_factors`), in every forward: what a padded ``generate`` batch needs (its samples
    all on one side of the original context: :func:`longrope_groups`)."""
    with contextlib.ExitStack() as stack:
        for m in longrope_modules(model):
            stack.enter_context(fixed_rope(m, *longrope_factors(m, total)))
        yield


def longrope_groups(model, items: Sequence, max_new_tokens: int) -> list[list]:
    """``items`` (``.input_ids``) split by the LongRoPE factor set each sample takes (:func:`longrope_long`: prompt
    + max new tokens past the original context or not), so that a padded batch never mixes them; one group for other
    models."""
    mods = longrope_modules(model)
    if not mods:
        return [list(items)]
    groups: dict[bool, list] = {}
    for it in items:
        groups.setdefault(longrope_long(mods[0], len(it.input_ids) + max_new_tokens), []).append(it)
    return [groups[k] for k in sorted(groups)]


# ---------------------------------------------------------------- per decode slot
class SlotRope:
    """How one rotary module gives every slot its own frequencies during a decode step: per slot, the frequencies
    of that sample alone (:meth:`slot`), then the module's undecorated forward on that slot's row (:attr:`forward`,
    for :func:`ropescale.common.compat.rope.rope_forward`). A subclass per rule: :meth:`prefill` puts the module in
    the sample's state for its prefill, :meth:`take` stores what the slot keeps."""

    def __init__(self, module):
        self.m = module
        self.state: dict = {}  # slot -> what the rule keeps for it
        self.forward = per_row_forward(module, self.slot)

    @contextlib.contextmanager
    def prefill(self, n: int, total: int):
        """Around the prefill of a sample of ``n`` prompt tokens and at most ``total`` tokens in all."""
        yield

    def take(self, row: int) -> None:
        """After the prefill of slot ``row``."""

    def slot(self, row: int, seq_len: int, device):
        """(inv_freq, attention_scaling) of slot ``row`` at ``seq_len`` tokens."""
        raise NotImplementedError


class SlotDynamicNTK(SlotRope):
    """Dynamic NTK (transformers' ``dynamic``): each sample from a fresh module (reset before its prefill), and in
    a decode step the slot's frequencies updated as transformers' dynamic update would for that sample alone (grow
    when the position passes what the slot has seen)."""

    @contextlib.contextmanager
    def prefill(self, n: int, total: int):
        reset_dynamic_rope([self.m])
        yield

    def take(self, row: int) -> None:
        self.state[row] = rope_frequencies(self.m)  # [inv_freq, seen (max seq len), attention_scaling]

    def slot(self, row: int, seq_len: int, device):
        st = self.state[row]
        if seq_len > st[1]:  # transformers: grow to the current length
            st[0], st[2] = rope_frequencies_for_length(self.m, device, seq_len)
            st[1] = seq_len
        return st[0], st[2]


class SlotLengthRule(SlotRope):
    """A rule of this repo's own that follows the length (dynamic YaRN: ``rope_scaling.load.install_rope_rule``):
    the prefill's forward computes it at the prompt's length; a decode step at each slot's own length."""

    def slot(self, row: int, seq_len: int, device):
        return length_rope_frequencies(self.m, seq_len, device)


class SlotLongRope(SlotRope):
    """LongRoPE (transformers' ``longrope``): one factor set per sample, for its prefill and every decode step
    (:func:`longrope_factors`)."""

    @contextlib.contextmanager
    def prefill(self, n: int, total: int):
        self.current = longrope_factors(self.m, total)
        with fixed_rope(self.m, *self.current):
            yield

    def take(self, row: int) -> None:
        self.state[row] = self.current

    def slot(self, row: int, seq_len: int, device):
        return self.state[row]


def slot_ropes(model) -> list[SlotRope]:
    """The per-slot rule of every rotary module of ``model`` whose frequencies depend on the length."""
    out: list[SlotRope] = [SlotDynamicNTK(m) for m in dynamic_rope_modules(model)]
    out += [SlotLengthRule(m) for m in length_rope_modules(model)]
    out += [SlotLongRope(m) for m in longrope_modules(model)]
    return out
