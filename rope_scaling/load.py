"""Loading a model with a RoPE spec: the one way finetune, merge, generate and the probes get a config with the spec
applied (:func:`load_config`, the rule of :func:`rope_scaling.apply_rope`) and the model under it
(:func:`load_model`). The config is read into a RoPE spec once, here: :class:`ModelConfig` carries the config, what
was done to it, what it carries now and the context it serves, and every stage passes that object on instead of
reading the config again. transformers is imported here, lazily; the rest of the package stays plain math and dicts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ropescale.common import attention_extend
from ropescale.common.io import InputError

from .args import warn_range
from .formulas import REGISTRY
from .hf import RopeChange, RopeState, change_rope, extended_context, rope_state, served_context
from .spec import RopeSpec

# the config fields apply_rope writes (what vLLM must be told as hf_overrides)
ROPE_FIELDS = ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings")
CHANGED = ("applied", "replaced", "removed")


@dataclass(frozen=True)
class ModelConfig:
    """A model's config with a RoPE spec applied, read once (:func:`load_config`): what every stage passes on."""

    path: Path  # the model directory (or a hub id)
    config: Any  # the transformers config, the spec written in
    change: RopeChange  # what applying the spec did (kept, unchanged, applied, replaced, removed)
    state: RopeState  # what the config carries now: the spec, and the unscaled model underneath
    context: int | None  # the context the setting serves (hf.served_context): an attention method's reach included;
    # None = unbounded (DCA): every length is within it
    rope_context: int  # the frequency method's extended context (hf.extended_context): a finite default length

    @property
    def rope(self) -> RopeSpec:
        """The spec the model runs with (the flags, or what its config already carries)."""
        return self.state.spec

    @property
    def orig_ctx(self) -> int:
        """The unscaled model's original context."""
        return self.state.orig_ctx

    def rope_fields(self) -> dict:
        """The config fields the RoPE change wrote (empty when the config was kept as saved): vLLM's
        hf_overrides."""
        if self.change.action not in CHANGED:
            return {}
        d = self.config.to_dict()
        return {k: d[k] for k in ROPE_FIELDS if k in d}


def load_config(model_dir: str | os.PathLike, spec: RopeSpec | None = None) -> ModelConfig:
    """The model's config with ``spec`` applied (a :class:`ModelConfig`), before any weights are loaded. ``spec``
    None (or method none) keeps the config as saved; a config that already carries scaling takes the same spec
    again as a no-op and another one only with ``replace``. Errors name the model's config.json."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    if model_dir.exists():
        if not (model_dir / "config.json").is_file():
            raise InputError("not a model directory (no config.json)", model_dir)
        from ropescale.common.models import check_config

        check_config(model_dir / "config.json")  # malformed, or not a model config: one line, not a traceback
    config = AutoConfig.from_pretrained(str(model_dir))
    spec = spec if spec is not None else RopeSpec()
    warn_range(spec)  # past the method's published range: one line on stderr
    try:
        change, state = change_rope(config, spec)
    except InputError as e:
        raise InputError(e.message, e.path or model_dir / "config.json", e.line) from None
    return ModelConfig(model_dir, config, change, state, served_context(config, state),
                       int(extended_context(config, state)))


def load_model(model_dir: str | os.PathLike, config, *, dtype, attn: str | None = None, state: RopeState | None = None):
    """The causal LM in ``model_dir`` with ``config`` (the rope already applied), in ``dtype`` with attention
    ``attn``, running the rope the config carries (:func:`install_rope_rule`: dynamic_yarn per forward; ``state``: the
    RopeState read with the config, ``ModelConfig.state``, so that it is not read again; read here only when not
    given). Under an active ZeRO-3 DeepSpeed config transformers partitions the weights while loading."""
    from transformers import AutoModelForCausalLM

    from ropescale.common.compat import dtype_kwargs
    from ropescale.common.models import check_weights

    if Path(model_dir).exists():  # a hub id is transformers' to fetch and check
        check_weights(Path(model_dir))
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, **dtype_kwargs(dtype), **kw)
    state = state if state is not None else rope_state(config)
    install_rope_rule(model, state)
    install_attention(model, state)
    return model


def install_attention(model, state: RopeState) -> int:
    """Run the spec's attention-level method (``--attention-extend self_extend | dca``) in every forward of ``model``
    (:func:`ropescale.common.attention_extend.install`; full-attention layers only, sliding-window layers keep plain
    SDPA); DCA's sizes default from the original context. Returns the number of attention modules under it (0: none
    asked)."""
    rule = attention_extend.spec_rule(state.spec, state.orig_ctx)
    if rule is None:
        return 0
    from ropescale.common.compat.rope import layer_inv_freq

    return attention_extend.install(model, rule, lambda i: layer_inv_freq(model, i, full_only=True))


def install_rope_rule(model, state: RopeState) -> int:
    """Give ``model`` the rope rule of ``state`` where transformers' own rotary module computes another one: a method
    whose frequencies this repo recomputes in every forward (``formulas.Method.per_forward``: dynamic_yarn, written
    into the config as static ``yarn`` x s, what plain transformers runs) gets them for each forward's length L
    (``formulas.frequencies``; dynamic YaRN: s = max(1, L / orig), plain RoPE up to the original context) through
    :func:`ropescale.common.compat.rope.install_length_rope`. Every stage loads through :func:`load_model`, so training,
    generation, the probes and merge's in-process model all run it. Returns the number of rotary modules changed
    (0: transformers' module computes the spec as it is)."""
    if not REGISTRY[state.spec.method].per_forward:
        return 0
    from ropescale.common.compat.rope import install_length_rope

    def rule(seq_len: int):
        f = state.frequencies(seq_len)
        return f.inv_freq, f.attention_factor

    return install_length_rope(model, rule)
