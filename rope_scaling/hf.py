"""The one adapter that writes a RopeSpec into, and reads it back from, a Hugging Face config.

Every method is expressed as plain HF rope entries (each method's own entries: ``formulas.REGISTRY``), so a saved
model reloads with ``AutoModelForCausalLM`` (and vLLM) without importing this repo:

==============  =========================================================  ==========================
method          rope entries (``rope_parameters`` on 5.x)                  max_position_embeddings
==============  =========================================================  ==========================
pi              linear, factor s                                           orig * s
ntk             default, rope_theta = b * s^(d/(d-2))                      orig * s
abf             default, rope_theta = rope_base                            orig * s
dynamic_ntk     dynamic, factor s  (HF reads max_position_embeddings as    orig
                the original context, so it stays orig)
yarn            yarn, factor, beta_fast, beta_slow, original_max_position  orig * s
                _embeddings (+ attention_factor, and vLLM's attn_factor,
                when --yarn-mscale is given)
dynamic_yarn    yarn as above at factor s: plain transformers / vLLM run    orig * s
                static YaRN x s (equal at orig * s); this repo reads the
                record below as dynamic_yarn
llama3          llama3, factor, low/high_freq_factor, original_max_...     orig * s
longrope        longrope, factor s, short_factor, long_factor, original    orig * s
                _max_position_embeddings (+ attention_factor when set)
==============  =========================================================  ==========================

``--rope-base`` replaces rope_theta first (ABF), then the method applies. transformers 5.x keeps everything in
``config.rope_parameters`` (rope_theta inside; the dict is always rebuilt whole); 4.x uses ``config.rope_scaling``
plus ``config.rope_theta``. Plain dicts (a loaded config.json) of either shape work too.

What HF entries cannot say (ntk vs abf vs none all look like "default"; the pre-scaling base and context) is kept
in one extra top-level config key, ``ropescale_rope``, which transformers stores and reloads untouched. It is
trusted only while the rope entries still match what was written; otherwise the HF entries alone are read.
"""
from __future__ import annotations

import dataclasses
import math

from ropescale.common import compat
from ropescale.common.attention_extend import max_context, spec_rule
from ropescale.common.compat import config_get as _get
from ropescale.common.compat import config_set as _set
from ropescale.common.io import InputError

from .formulas import PLAIN, PROPORTIONAL, REGISTRY, Freqs, check_model, frequencies, hf_entries, hf_readers
from .spec import RopeSpec

RECORD_KEY = "ropescale_rope"
DEFAULT_THETA = 10000.0  # transformers' default_theta when a config names no base
DEFAULT_TYPE = REGISTRY[PLAIN].reads  # transformers' rope_type of unscaled RoPE (4.x: no rope_scaling at all)
_WRITTEN_LISTS = ("short_factor", "long_factor")  # longrope's entries the record must still match


# ---------------------------------------------------------------- config access: the 4.x / 5.x layouts live in compat
def _entries(cfg, layer_type: str | None = None) -> dict:
    """The config's rope entries as one flat 5.x-style dict: rope_type, rope_theta, and the type's keys; a
    per-layer-type config's global (full_attention) entries, or ``layer_type``'s
    (:func:`ropescale.common.compat.read_rope_entries`; InputError when it has none)."""
    try:
        return compat.read_rope_entries(cfg, DEFAULT_THETA, DEFAULT_TYPE, layer_type)
    except ValueError as e:
        raise InputError(str(e)) from None


def _write(cfg, entries: dict, max_pos: int, layer_type: str | None = None) -> None:
    """Replace the config's rope entries (``layer_type``'s on a per-layer-type config, default the global ones) by
    ``entries`` (complete) and set max_position_embeddings, in the config's own layout
    (:func:`ropescale.common.compat.write_rope_entries`)."""
    compat.write_rope_entries(cfg, entries, max_pos, DEFAULT_TYPE, layer_type)


def layer_types(cfg) -> dict[str, dict]:
    """A per-layer-type config's rope entries by layer type, global (full_attention) first, with how many layers
    each has (``layers``) and the sliding window of the others (``window``); {} for a config with one rope."""
    types = compat.rope_layer_types(cfg)
    if not types:
        return {}
    listed = list(_get(cfg, "layer_types") or ())
    out = {}
    for t in sorted(types, key=lambda t: t != compat.GLOBAL_LAYERS):
        out[t] = {"entries": _entries(cfg, t), "layers": listed.count(t),
                  "window": None if t == compat.GLOBAL_LAYERS else _get(cfg, "sliding_window")}
    return out


def rotary_dim(cfg) -> int:
    """head_dim * partial_rotary_factor: the number of rotated channels (d in every formula)."""
    hd = _get(cfg, "head_dim")
    if not hd:
        hs, nh = _get(cfg, "hidden_size"), _get(cfg, "num_attention_heads")
        if not hs or not nh:
            raise InputError("config has neither head_dim nor hidden_size / num_attention_heads")
        hd = hs // nh
    e = _entries(cfg)
    if e["rope_type"] == REGISTRY[PROPORTIONAL].reads:  # head_dim / 2 frequencies, the unrotated ones 0
        return int(hd)
    prf = e.get("partial_rotary_factor") or _get(cfg, "partial_rotary_factor") or 1.0
    return int(hd * prf)


# ---------------------------------------------------------------- reading
def _record(cfg, entries: dict) -> dict | None:
    """The ``ropescale_rope`` record, if present and still matching the rope entries."""
    rec = _get(cfg, RECORD_KEY)
    if not isinstance(rec, dict) or not isinstance(rec.get("spec"), dict) or not isinstance(rec.get("original"), dict):
        return None
    w = rec.get("written") or {}
    try:
        if w.get("rope_type") != entries["rope_type"] or not math.isclose(float(w.get("rope_theta")),
                                                                          float(entries["rope_theta"]), rel_tol=1e-9):
            return None
        if entries.get("factor") is not None and not math.isclose(float(w.get("factor") or 0), float(entries["factor"]),
                                                                 rel_tol=1e-9):
            return None
        for k in _WRITTEN_LISTS:  # longrope's factors, edited by hand: the entries win
            if k in w and [float(x) for x in w[k]] != [float(x) for x in entries.get(k) or ()]:
                return None
    except (TypeError, ValueError):
        return None
    return rec


def spec_from_entries(cfg, e: dict) -> RopeSpec:
    """A spec from HF rope entries alone (configs not written here, e.g. a model's native scaling): the registry
    method that reads the entry's rope_type (``formulas.hf_readers``; a type that needs a factor and names none is
    an InputError there)."""
    t, max_pos = e["rope_type"], _get(cfg, "max_position_embeddings")
    orig = e.get("original_max_position_embeddings") or _get(cfg, "original_max_position_embeddings")
    readers = hf_readers()
    if t not in readers:
        raise InputError(f"rope type {t!r} is not supported (supported: {', '.join(readers)})")
    return RopeSpec(**readers[t].from_hf(e, orig, max_pos))


def rope_entries(cfg) -> tuple[str, dict]:
    """(the config key that holds the rope dict: ``rope_parameters`` on 5.x, ``rope_scaling`` on 4.x, that dict's
    entries flattened 5.x-style with rope_type and rope_theta): what a writer of another format (vLLM's
    hf_overrides) starts from."""
    return compat.rope_key(cfg), _entries(cfg)


@dataclasses.dataclass(frozen=True)
class RopeState:
    """What a config carries: the spec, and the unscaled model underneath (base, context, max positions)."""

    spec: RopeSpec
    base: float  # the model's own RoPE base, before ABF / NTK
    orig_ctx: int  # its original context
    max_position_embeddings: int  # its unscaled max_position_embeddings
    rotary_dim: int

    def frequencies(self, seq_len: int | None = None) -> Freqs:
        return frequencies(self.spec, self.rotary_dim, self.base, seq_len)

    def original_frequencies(self) -> Freqs:
        """The unscaled model's own rope: plain RoPE (proportional rope's own zero pairs at factor 1)."""
        if self.spec.method == PROPORTIONAL:
            own = RopeSpec(PROPORTIONAL, rope_proportion=self.spec.rope_proportion, orig_ctx=self.orig_ctx)
            return frequencies(own, self.rotary_dim, self.base)
        return frequencies(RopeSpec(), self.rotary_dim, self.base)


def rope_state(cfg) -> RopeState:
    """The spec a config carries plus the unscaled model under it (InputError when it has no RoPE fields)."""
    e = _entries(cfg)
    d = rotary_dim(cfg)
    rec = _record(cfg, e)
    if rec is not None:
        o = rec["original"]
        return RopeState(RopeSpec.from_dict(rec["spec"]), float(o["base"]), int(o["orig_ctx"]),
                         int(o["max_position_embeddings"]), d)
    spec = spec_from_entries(cfg, e)
    check_model(spec, d)  # a config's longrope lists must hold one factor per rotary pair
    max_pos = _get(cfg, "max_position_embeddings")
    if not max_pos:
        raise InputError("config has no max_position_embeddings")
    if not spec.scaled:  # the model's own context: what the config names
        orig = _get(cfg, "original_max_position_embeddings") or max_pos
        return RopeState(spec, float(e["rope_theta"]), int(orig), int(max_pos), d)
    return RopeState(spec, float(e["rope_theta"]), int(spec.orig_ctx), int(spec.orig_ctx), d)


def read_rope(cfg) -> RopeSpec:
    """The RopeSpec a (saved) config carries: method none for plain RoPE, llama3 for Llama-3.x native scaling."""
    return rope_state(cfg).spec


def extended_context(cfg, state: RopeState | None = None) -> int:
    """The context the (scaled) config is meant for: orig_ctx * scale (max_position_embeddings when unscaled or
    for native llama3 scaling, whose configs state it: ``Method.states_context``): the frequencies' context, an
    attention-level method's reach aside (:func:`served_context` adds it). ``state``: the config's
    :func:`rope_state`, when the caller has read it already."""
    st = state if state is not None else rope_state(cfg)
    if REGISTRY[st.spec.method].states_context:
        return int(_get(cfg, "max_position_embeddings"))
    return int(round(st.orig_ctx * st.spec.scale))


def served_context(cfg, state: RopeState | None = None) -> int | None:
    """The context a setting serves -- what every stage labels, records and refuses by: the frequency method's
    :func:`extended_context` C, or with an attention-level method (the spec's ``attention_extend``) the longest
    context whose relative positions stay below C (``attention_extend.max_context`` over C: Self-Extend
    (C - W) * G + W, Jin et al. 2024 Sec 3.2; at least C). None = unbounded (DCA whose chunk fits C): every length is
    within it, and run.json's ``context`` is null. ``state``: the config's :func:`rope_state` (with the attention
    fields, as :func:`change_rope` returns it), when the caller has it."""
    st = state if state is not None else rope_state(cfg)
    ext = extended_context(cfg, st)
    rule = spec_rule(st.spec, st.orig_ctx)  # DCA's default sizes come from the original context
    if rule is None:
        return ext
    reach = max_context(rule, ext)
    return None if math.isinf(reach) else max(ext, int(reach))


# ---------------------------------------------------------------- writing
@dataclasses.dataclass(frozen=True)
class RopeChange:
    """What :func:`apply_rope` does (or did) with a spec on a config -- the one rule every CLI follows.

    action  kept: no --rope asked, the config is used as it is; unchanged: the config already carries exactly this
            spec (re-applying it is a no-op); applied: written onto an unscaled config; replaced: the config's
            scaling replaced (--replace); removed: --rope none --replace took the config's scaling away
    """

    action: str
    carried: RopeSpec  # what the config carried before
    requested: RopeSpec  # what was asked for
    target: RopeSpec | None = None  # what is written (applied / replaced), orig_ctx resolved
    layers: str = ""  # a per-layer-type config: which layer types are written (one clause)

    def message(self) -> str:
        return self._message() + (f" ({self.layers})" if self.layers and self.target is not None else "")

    def _message(self) -> str:
        cur = self.carried.label()
        if self.action == "kept":
            return ("the config carries no RoPE scaling" if not self.carried.scaled else
                    f"the config carries {cur} (no --rope asked: used as it is)")
        if self.action == "unchanged":
            return f"the config already carries {cur}: unchanged (the same setting again is a no-op)"
        if self.action == "replaced":
            return f"replaced {cur} by {self.target.label()} (--replace)"
        if self.action == "removed":
            return f"removed {cur} (--rope none --replace)"
        return f"applied {self.target.label()} to the unscaled config"

    def to_dict(self) -> dict:
        return {"action": self.action, "carried": self.carried.label(), "requested": self.requested.label(),
                "message": self.message()}


def plan_rope(cfg, spec: RopeSpec, state: RopeState | None = None) -> RopeChange:
    """What applying ``spec`` to ``cfg`` means, without changing it: InputError when the config already carries
    other scaling and ``spec.replace`` is not set (see :func:`apply_rope`). ``state``: the config's
    :func:`rope_state`, when the caller has read it already."""
    if not isinstance(spec, RopeSpec):
        raise TypeError(f"apply_rope needs a RopeSpec, got {type(spec).__name__}")
    spec = spec.rope_only()  # an attention method is the loaded model's (rope_scaling.load), not the config's
    st = state if state is not None else rope_state(cfg)
    cur = st.spec
    target = dataclasses.replace(spec, orig_ctx=spec.orig_ctx or st.orig_ctx, replace=False)  # checks the context
    check_model(target, st.rotary_dim)  # e.g. longrope: one factor per rotary pair of this model
    layers = _layers_clause(cfg, spec)
    if not spec.scaled and (not spec.replace or not cur.scaled):
        return RopeChange("kept", cur, spec)
    if cur.method == PROPORTIONAL:
        raise InputError(f"the config carries {cur.label()} (partial RoPE with zero frequencies, Gemma 4): another "
                         f"method on top of it is not supported")
    if not cur.scaled:
        return RopeChange("applied", cur, spec, target, layers)
    if cur.same_rope(target):
        return RopeChange("unchanged", cur, spec)
    if not spec.replace:
        raise InputError(f"config already carries {cur.label()} RoPE scaling; stacking {spec.label()} on "
                         f"top is not supported (pass --replace to replace it)")
    return RopeChange("replaced" if spec.scaled else "removed", cur, spec, target, layers)


def _layers_clause(cfg, spec: RopeSpec) -> str:
    """On a per-layer-type config, which layer types ``spec`` is written into (one clause for the report); InputError
    for --rope-layers all on a config with one rope, and for a method this repo recomputes per forward or per sample
    (its rotary hooks know one rope)."""
    types = layer_types(cfg)
    if not types:
        if spec.rope_layers != "full":
            raise InputError(f"--rope-layers {spec.rope_layers}: the config has one rope for every layer (no "
                             f"per-layer-type rope_parameters)")
        return ""
    m = REGISTRY[spec.method]
    if spec.scaled and (m.per_forward or m.by_length and m.reads != "dynamic"):
        raise InputError(f"--rope {spec.method} on a per-layer-type config (layer types {', '.join(types)}) is not "
                         f"supported: its per-forward rule knows one rope")
    others = [t for t in types if t != compat.GLOBAL_LAYERS]
    if spec.rope_layers == "all":
        return f"every layer type: {', '.join(types)}, each at its own base"
    return (f"{compat.GLOBAL_LAYERS} layers only; {', '.join(others)} keep their RoPE: --rope-layers all to scale "
            f"them too")


def apply_rope(cfg, spec: RopeSpec, state: RopeState | None = None):
    """Write ``spec`` into ``cfg`` in place (and return it), as plain HF entries; apply before building the model.
    :func:`plan_rope` says beforehand what it will do (the same rule, for reports).

    Method none is a no-op (with ``replace``: the config's scaling is removed). A config that already carries
    scaling (Llama-3.x ``llama3``, or one applied earlier) is an InputError unless ``spec.replace``, in which
    case the new method is applied to the unscaled model underneath; re-applying the spec a config already
    carries is a no-op. ``orig_ctx`` None means the config's original context. Every CLI goes through this one
    rule (``describe``, ``finetune.py``, ``eval_summ generate``, the probes). ``state``: the config's
    :func:`rope_state`, when the caller has read it already.
    """
    st = state if state is not None else rope_state(cfg)
    change = plan_rope(cfg, spec, st)  # spec.rope_only(): the attention method is not written
    if change.action in ("kept", "unchanged"):
        return cfg
    e = _entries(cfg)
    extra = {k: e[k] for k in ("partial_rotary_factor",) if k in e}
    if change.action == "removed":
        _write(cfg, {"rope_type": DEFAULT_TYPE, "rope_theta": st.base, **extra}, st.max_position_embeddings)
        _set(cfg, RECORD_KEY, None)
        return cfg
    target = change.target
    entries, max_pos = hf_entries(target, st.base, st.rotary_dim)
    if target.rope_layers == "all":  # every other layer type, at its own base (its rotary dim is the model's)
        for t, info in layer_types(cfg).items():
            if t != compat.GLOBAL_LAYERS:
                own, _ = hf_entries(target, float(info["entries"]["rope_theta"]), st.rotary_dim)
                _write(cfg, own, max_pos, t)
    _write(cfg, {**entries, **extra}, max_pos)
    _set(cfg, RECORD_KEY, {
        "spec": target.to_dict(),
        "original": {"base": st.base, "orig_ctx": st.orig_ctx, "max_position_embeddings": st.max_position_embeddings},
        "written": {k: entries[k] for k in ("rope_type", "rope_theta", "factor", *_WRITTEN_LISTS) if k in entries},
    })
    return cfg


def change_rope(cfg, spec: RopeSpec) -> tuple[RopeChange, RopeState]:
    """:func:`apply_rope` reading the config once: (what was done, what the config carries now, as
    :func:`rope_state` would read it back, plus ``spec``'s attention method, which only the loaded model runs)."""
    st = rope_state(cfg)
    change = plan_rope(cfg, spec, st)
    apply_rope(cfg, spec, st)
    att = spec.attention_fields()  # the attention method rides on the state's spec, never on the config
    if change.action in ("kept", "unchanged"):
        return change, dataclasses.replace(st, spec=dataclasses.replace(st.spec, **att))
    if change.action == "removed":
        orig = _get(cfg, "original_max_position_embeddings") or st.max_position_embeddings  # as rope_state reads it
        return change, dataclasses.replace(st, spec=RopeSpec(orig_ctx=st.max_position_embeddings, **att),
                                           orig_ctx=int(orig))
    return change, dataclasses.replace(st, spec=dataclasses.replace(change.target, **att))
