"""Loading a model with a RoPE spec: the one way finetune, merge, generate and the probes get a config with the spec
applied (:func:`load_config`, the rule of :func:`rope_scaling.apply_rope`) and the model under it
(:func:`load_model`). transformers is imported here, lazily; the rest of the package stays plain math and dicts.
"""
from __future__ import annotations

import os
from pathlib import Path

from ropescale.common.io import InputError, read_json

from .hf import RopeChange, apply_rope, plan_rope
from .spec import RopeSpec

# the config fields apply_rope writes (what vLLM must be told as hf_overrides)
ROPE_FIELDS = ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings")
CHANGED = ("applied", "replaced", "removed")


def load_config(model_dir: str | os.PathLike, spec: RopeSpec | None = None):
    """(the model's config with ``spec`` applied, what was done: a :class:`RopeChange`), before any weights are
    loaded. ``spec`` None (or method none) keeps the config as saved; a config that already carries scaling takes
    the same spec again as a no-op and another one only with ``replace``. Errors name the model's config.json."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    if model_dir.exists():
        if not (model_dir / "config.json").is_file():
            raise InputError("not a model directory (no config.json)", model_dir)
        read_json(model_dir / "config.json", "config.json")  # a malformed file is one line, not a traceback
    config = AutoConfig.from_pretrained(str(model_dir))
    spec = spec if spec is not None else RopeSpec()
    try:
        change = plan_rope(config, spec)
        apply_rope(config, spec)
    except InputError as e:
        raise InputError(e.message, e.path or model_dir / "config.json", e.line) from None
    return config, change


def rope_fields(config, change: RopeChange) -> dict:
    """The config fields a RoPE change wrote (empty when the config was kept as saved)."""
    if change.action not in CHANGED:
        return {}
    d = config.to_dict()
    return {k: d[k] for k in ROPE_FIELDS if k in d}


def load_model(model_dir: str | os.PathLike, config, *, dtype, attn: str | None = None):
    """The causal LM in ``model_dir`` with ``config`` (the rope already applied), in ``dtype`` with attention
    ``attn``. Under an active ZeRO-3 DeepSpeed config transformers partitions the weights while loading."""
    from transformers import AutoModelForCausalLM

    from ropescale.common.compat import dtype_kwargs
    from ropescale.common.tiny import check_weights

    if Path(model_dir).exists():  # a hub id is transformers' to fetch and check
        check_weights(Path(model_dir))
    kw = {"attn_implementation": attn} if attn else {}
    return AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, **dtype_kwargs(dtype), **kw)
