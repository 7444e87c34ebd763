"""transformers' rotary modules: the dynamic-NTK internals and the same modules under this repo's own rules (dynamic
YaRN, LongRoPE's short/long choice per slot, candidate frequencies). Part of :mod:`ropescale.common.compat`, whose
docstring lists every shim with the versions it was written against; import them from there."""
from __future__ import annotations

import inspect


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
    cos/sin of the frequencies the module holds. For a module under :func:`install_length_rope`, its model class's
    forward, not the length rule's."""
    return getattr(type(m), "_ropescale_raw", None) or inspect.unwrap(type(m).forward)


# ================================================================ transformers: rotary modules under this repo's rules
# The same rotary modules (4.48+ and 5.x): ``forward(x, position_ids) -> (cos, sin)`` computed from the ``inv_freq``
# buffer and ``attention_scaling`` they hold, under ``dynamic_rope_update``, which changes them only for rope types
# containing "dynamic" and for "longrope" (short factors while max(position_ids) + 1 <= the original context, long
# past it, for the whole batch).
def rotary_modules(model) -> list:
    """The model's rotary-embedding modules: an ``inv_freq`` buffer, ``attention_scaling`` and a ``rope_type``."""
    return [m for m in model.modules() if isinstance(getattr(m, "rope_type", None), str)
            and hasattr(m, "inv_freq") and hasattr(m, "attention_scaling")]


_LENGTH_CLASSES: dict = {}  # a model's rotary class -> its subclass under a length rule (one per class)


def _length_class(cls):
    """``cls`` with a forward that first takes its frequencies from the module's length rule at L = max(position_ids)
    + 1 (this forward's length), then runs ``cls``'s own forward without ``dynamic_rope_update``."""
    if cls not in _LENGTH_CLASSES:
        raw = inspect.unwrap(cls.forward)

        def forward(self, x, position_ids, *args, **kwargs):
            inv, att = length_rope_frequencies(self, int(position_ids.max()) + 1, x.device)
            set_rope_frequencies(self, inv, att)
            return raw(self, x, position_ids, *args, **kwargs)

        _LENGTH_CLASSES[cls] = type(f"LengthRule{cls.__name__}", (cls,),
                                    {"forward": forward, "_ropescale_raw": raw, "__module__": cls.__module__})
    return _LENGTH_CLASSES[cls]


def install_length_rope(model, rule) -> int:
    """Let every rotary module of ``model`` compute its frequencies in every forward from that forward's length L =
    max(position_ids) + 1: ``rule(L) -> (inv_freq: d/2 floats, attention factor)`` (e.g. dynamic YaRN, which no
    transformers rope type computes). The module's class is swapped for a subclass of it (:func:`_length_class`):
    an instance attribute (the slot decoder's per-slot forward, sequence parallelism's global length) still
    shadows it, and its model class's own forward stays reachable (:func:`undecorated_rope_forward`). Each
    length's frequencies are computed once per device. Returns the number of modules."""
    mods = rotary_modules(model)
    for m in mods:
        if type(m) not in _LENGTH_CLASSES.values():
            m.__class__ = _length_class(type(m))
        m._ropescale_length_rule = rule
        m._ropescale_length_cache = {}
    return len(mods)


def length_rope_modules(model) -> list:
    """The rotary modules of ``model`` under :func:`install_length_rope`."""
    return [m for m in model.modules() if getattr(m, "_ropescale_length_rule", None) is not None]


def length_rope_frequencies(m, seq_len: int, device):
    """(inv_freq tensor (float32 on ``device``), attention factor) of a module under :func:`install_length_rope`
    for a sequence of ``seq_len`` tokens."""
    import torch

    cache = m._ropescale_length_cache
    key = (int(seq_len), str(device))
    if key not in cache:
        if len(cache) >= 4096:
            cache.clear()
        inv, att = m._ropescale_length_rule(int(seq_len))
        cache[key] = (torch.tensor([float(v) for v in inv], dtype=torch.float32, device=device), float(att))
    return cache[key]


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
