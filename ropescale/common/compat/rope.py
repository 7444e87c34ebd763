"""transformers' rotary modules: the dynamic-NTK internals, and the one wrapper that installs this repo's rules on
them (:func:`wrap_rotary`): per sequence (dynamic YaRN, LongRoPE search candidates: :func:`install_length_rope`), the
whole sample's length for a shard (sequence parallelism: :func:`install_global_length`), per decode slot or with
fixed frequencies (the slot decoder: :func:`rope_forward`). The shims of :mod:`ropescale.common.compat` that touch
rotary modules; that package's docstring lists them with the versions they were written against."""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Callable


# ================================================================ transformers: dynamic-NTK rotary modules
# The rotary module of Llama / Qwen2 / Mistral (4.48+ and 5.x): rope_type, inv_freq (a buffer), attention_scaling,
# and for "dynamic" types original_inv_freq, original_max_seq_len, max_seq_len_cached, updated by the
# dynamic_rope_update decorator around forward(x, position_ids) -> (cos, sin).
def dynamic_rope_modules(model) -> list:
    """The model's rotary modules that use transformers' dynamic NTK (their base follows the sequence length)."""
    out = []
    for m in model.modules():
        rt = getattr(m, "rope_type", None)
        if isinstance(rt, str) and "dynamic" in rt and hasattr(m, "original_inv_freq") \
                and hasattr(m, "original_max_seq_len"):
            out.append(m)
    return out


def reset_dynamic_rope(modules) -> None:
    """Put dynamic-NTK rotary modules back in their freshly loaded state (original frequencies, nothing cached), as
    transformers' own reset does when a sequence shorter than the original context comes."""
    for m in modules:
        m.inv_freq = m.original_inv_freq.clone()
        m.max_seq_len_cached = m.original_max_seq_len


def rope_frequencies(m) -> list:
    """[inv_freq, the longest sequence it was computed for, attention_scaling] of a rotary module. (5.0.x never
    updates ``max_seq_len_cached``: it stays at the original context, so a slot recomputes once more; harmless.)"""
    return [m.inv_freq, int(m.max_seq_len_cached), m.attention_scaling]


def set_rope_frequencies(m, inv_freq, attention_scaling) -> None:
    m.inv_freq, m.attention_scaling = inv_freq, attention_scaling


def rope_frequencies_for_length(m, device, seq_len: int):
    """(inv_freq, attention_scaling) of module ``m``'s rope type for a sequence of ``seq_len`` tokens: what
    ``dynamic_rope_update`` computes when a sequence grows (``ROPE_INIT_FUNCTIONS[rope_type]``)."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    t = torch.tensor(int(seq_len), dtype=torch.long, device=device)
    return ROPE_INIT_FUNCTIONS[m.rope_type](m.config, device, seq_len=t)


def undecorated_rope_forward(m):
    """The rotary module's forward without ``dynamic_rope_update`` (called as ``fn(module, x, position_ids)``): the
    cos/sin of the frequencies the module holds. For a module under :func:`wrap_rotary`, its model class's forward,
    not the wrapper's."""
    return getattr(type(m), "_ropescale_raw", None) or inspect.unwrap(type(m).forward)


# ================================================================ transformers: one wrapper for this repo's rules
# The same rotary modules (4.48+ and 5.x): ``forward(x, position_ids, *rest) -> (cos, sin)`` computed from the
# ``inv_freq`` buffer and ``attention_scaling`` they hold, under ``dynamic_rope_update``, which changes them only for
# rope types containing "dynamic" and for "longrope" (short factors while max(position_ids) + 1 <= the original
# context, long past it, for the whole batch), reading the length as max(position_ids) + 1.
def rotary_modules(model) -> list:
    """The model's rotary-embedding modules: an ``inv_freq`` buffer, ``attention_scaling`` and a ``rope_type``."""
    return [m for m in model.modules() if isinstance(getattr(m, "rope_type", None), str)
            and hasattr(m, "inv_freq") and hasattr(m, "attention_scaling")]


def rotary_embedding_modules(model) -> list:
    """Every rotary-embedding module of a model by its class name (``*RotaryEmbedding``): one, or one for all layer
    types (Gemma 3's per-layer-type module keeps ``{type}_inv_freq`` and a dict of rope types, which
    :func:`rotary_modules` leaves out)."""
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


@dataclass
class RopeRules:
    """What this repo's wrapper of one rotary module runs (:func:`wrap_rotary`), first match wins:

    - ``forward``: a forward of the caller's in place of everything below (the slot decoder's per-slot and fixed
      frequencies: :func:`rope_forward`, :func:`per_row_forward`, :func:`fixed_rope`);
    - ``top``: the last position of the whole sample (sequence parallelism: a shard's rule sees the whole length,
      :func:`global_length`), read only where ``whole_sample`` (:func:`install_global_length`);
    - ``length``: per sequence, ``rule(L) -> (inv_freq, attention factor)`` at L = max(position_ids) + 1
      (:func:`install_length_rope`);
    - else the model class's own forward."""

    length: Callable | None = None
    cache: dict = field(default_factory=dict)  # (length, device) -> the length rule's frequencies there
    whole_sample: bool = False
    top: int | None = None
    forward: Callable | None = None


RULES_ATTR = "_ropescale_rope"  # the instance attribute holding a wrapped module's RopeRules
_WRAPPED: dict = {}  # a model's rotary class -> its wrapped subclass (one per class)


def _wrapped_class(cls):
    """``cls`` with a forward that runs the module's :class:`RopeRules`; ``_ropescale_raw`` keeps ``cls``'s own
    forward without ``dynamic_rope_update`` (:func:`undecorated_rope_forward`)."""
    if cls not in _WRAPPED:
        raw, own = inspect.unwrap(cls.forward), cls.forward

        def by_length(self, r, x, position_ids, *args, **kwargs):
            if r.length is None:
                return own(self, x, position_ids, *args, **kwargs)
            inv, att = length_rope_frequencies(self, int(position_ids.max()) + 1, x.device)
            set_rope_frequencies(self, inv, att)
            return raw(self, x, position_ids, *args, **kwargs)

        def forward(self, x, position_ids, *args, **kwargs):
            r = self.__dict__[RULES_ATTR]
            if r.forward is not None:
                return r.forward(x, position_ids, *args, **kwargs)
            if r.whole_sample and r.top is not None and position_ids is not None:
                import torch

                col = position_ids.new_full((*position_ids.shape[:-1], 1), r.top)
                cos, sin = by_length(self, r, x, torch.cat([position_ids.clamp(max=r.top), col], dim=-1), *args,
                                     **kwargs)
                return cos[..., :-1, :], sin[..., :-1, :]
            return by_length(self, r, x, position_ids, *args, **kwargs)

        _WRAPPED[cls] = type(cls.__name__, (cls,), {"forward": forward, "_ropescale_raw": raw,
                                                    "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _WRAPPED[cls]


def wrap_rotary(m) -> RopeRules:
    """Put rotary module ``m`` under this repo's wrapper (once: its class swapped for a subclass of it, so
    ``isinstance`` and its own forward stay) and return its :class:`RopeRules`, empty at first (the module then
    computes what its class computes)."""
    if type(m) not in _WRAPPED.values():
        m.__class__ = _wrapped_class(type(m))
        setattr(m, RULES_ATTR, RopeRules())
    return m.__dict__[RULES_ATTR]


def rope_rules(m) -> RopeRules | None:
    """The :class:`RopeRules` of a wrapped rotary module, None when it runs as loaded."""
    return m.__dict__.get(RULES_ATTR)


def install_length_rope(model, rule) -> int:
    """Let every rotary module of ``model`` compute its frequencies in every forward from that forward's length L =
    max(position_ids) + 1: ``rule(L) -> (inv_freq: d/2 floats, attention factor)`` (e.g. dynamic YaRN, which no
    transformers rope type computes), through :func:`wrap_rotary`. Each length's frequencies are computed once per
    device. Returns the number of modules."""
    mods = rotary_modules(model)
    for m in mods:
        r = wrap_rotary(m)
        r.length, r.cache = rule, {}
    return len(mods)


def length_rope_modules(model) -> list:
    """The rotary modules of ``model`` under :func:`install_length_rope`."""
    return [m for m in model.modules() if getattr(rope_rules(m), "length", None) is not None]


def length_rope_frequencies(m, seq_len: int, device):
    """(inv_freq tensor (float32 on ``device``), attention factor) of a module under :func:`install_length_rope`
    for a sequence of ``seq_len`` tokens."""
    import torch

    r = rope_rules(m)
    key = (int(seq_len), str(device))
    if key not in r.cache:
        if len(r.cache) >= 4096:
            r.cache.clear()
        inv, att = r.length(int(seq_len))
        r.cache[key] = (torch.tensor([float(v) for v in inv], dtype=torch.float32, device=device), float(att))
    return r.cache[key]


def install_global_length(modules) -> int:
    """Let rotary ``modules`` rotate a part of a sample as part of the whole (inside :func:`global_length`): their
    positions are extended by one column holding the sample's last position (pads past it clamped to it) before the
    module's rule runs, and that column is dropped from the result, so a rule that reads the length from the
    positions (``dynamic_rope_update``: dynamic NTK, longrope; :func:`install_length_rope`) sees the whole
    sample's; cos/sin of the other rules are functions of each position alone, unchanged. Returns the count."""
    for m in modules:
        wrap_rotary(m).whole_sample = True
    return len(modules)


@contextlib.contextmanager
def global_length(modules, max_position):
    """Inside: the ``modules`` under :func:`install_global_length` take ``max_position`` as the sample's last
    position (None: as the positions they are given)."""
    rules = [r for r in map(rope_rules, modules) if r is not None and r.whole_sample]
    top = None if max_position is None else int(max_position)
    for r in rules:
        r.top = top
    try:
        yield
    finally:
        for r in rules:
            r.top = None


@contextlib.contextmanager
def rope_forward(m, forward):
    """Inside: rotary module ``m`` runs ``forward(x, position_ids, *rest) -> (cos, sin)`` in place of its own."""
    r = wrap_rotary(m)
    saved, r.forward = r.forward, forward
    try:
        yield
    finally:
        r.forward = saved


def per_row_forward(m, frequencies):
    """A forward for :func:`rope_forward`: row r of a batch rotates with ``frequencies(r, L, device) -> (inv_freq,
    attention_scaling)`` at L = its last position + 1 (the module's undecorated forward on that row alone), the
    module's own frequencies put back after."""
    raw = undecorated_rope_forward(m)

    def forward(x, position_ids, *args, **kwargs):
        import torch

        saved = rope_frequencies(m)
        cos, sin = [], []
        try:
            for row, p in enumerate(position_ids[:, -1].tolist()):
                set_rope_frequencies(m, *frequencies(row, int(p) + 1, x.device))
                c, s_ = raw(m, x[row:row + 1], position_ids[row:row + 1], *args, **kwargs)
                cos.append(c)
                sin.append(s_)
        finally:
            set_rope_frequencies(m, saved[0], saved[2])
        return torch.cat(cos), torch.cat(sin)

    return forward


@contextlib.contextmanager
def fixed_rope(m, inv_freq, attention_scaling):
    """Inside: rotary module ``m`` computes cos/sin from ``inv_freq`` and ``attention_scaling`` in every forward,
    whatever the length (its undecorated forward, :func:`rope_forward`)."""
    raw = undecorated_rope_forward(m)
    saved = rope_frequencies(m)

    def forward(x, position_ids, *args, **kwargs):
        return raw(m, x, position_ids, *args, **kwargs)

    set_rope_frequencies(m, inv_freq, attention_scaling)
    try:
        with rope_forward(m, forward):
            yield
    finally:
        set_rope_frequencies(m, saved[0], saved[2])


def rotary_modules_of_type(model, rope_type: str) -> list:
    """The model's rotary modules of transformers' type ``rope_type`` (the caller names it: the registry row's
    ``reads``, e.g. LongRoPE's)."""
    return [m for m in rotary_modules(model) if m.rope_type == rope_type]


def longrope_original_context(m) -> int:
    """The context a ``longrope`` module switches at: past it, long factors (its config's
    ``rope_parameters["original_max_position_embeddings"]``, what ``dynamic_rope_update`` reads)."""
    return int(m.config.rope_parameters["original_max_position_embeddings"])


def longrope_frequencies(m, device, long: bool):
    """(inv_freq, attention_scaling) of a ``longrope`` module with its long (``long``) or short factors:
    ``ROPE_INIT_FUNCTIONS[m.rope_type](config, device, seq_len=)`` past / within the original context."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    seq_len = longrope_original_context(m) + 1 if long else None
    return ROPE_INIT_FUNCTIONS[m.rope_type](m.config, device, seq_len=seq_len)


def layer_inv_freq(model, layer_idx: int, full_only: bool = False):
    """A callable returning the inverse frequencies layer ``layer_idx`` of ``model`` rotates with now: its layer
    type's ``{type}_inv_freq`` buffer on a per-layer-type rotary module (Gemma 3, 5.x), else the model's one rotary
    module's ``inv_freq``; None with ``full_only`` for a layer whose type is not ``full_attention`` (sliding window),
    or when the model has no rotary module."""
    cfg = getattr(model.config, "text_config", None) or model.config
    types = getattr(cfg, "layer_types", None)
    lt = types[layer_idx] if types else "full_attention"
    if full_only and lt != "full_attention":
        return None
    for m in model.modules():
        if hasattr(m, f"{lt}_inv_freq"):
            return lambda m=m: getattr(m, f"{lt}_inv_freq")
    mods = rotary_modules(model)
    if not mods:
        return None
    return lambda m=mods[0]: m.inv_freq
