"""RoPE context extension: PI, static / dynamic NTK, YaRN, dynamic YaRN, ABF, Llama-3 and LongRoPE, written into
Hugging Face configs.

    from rope_scaling import RopeSpec, add_rope_args, spec_from_args, apply_rope, read_rope, extended_context

``apply_rope`` is the one rule for a config that already carries scaling (same spec again: no-op; another one:
refused unless ``--replace``); ``plan_rope`` says what it will do, for reports.

- ``formulas``: one registry row per method (``REGISTRY``): its inv_freq / attention-factor formula, its HF entries,
  its checks, its own fields, its runtime rule, what describe adds, its help line (how vLLM serves the HF type it
  writes is the vllm backend's).
- ``bounds``: the angle bounds of a scaled rope (``reach``, ``finetune_bound``, Liu et al.'s critical dimension).
- ``spec``: ``RopeSpec``, the setting; its fields are the ``--rope/--scale/--rope-base/--orig-ctx/--yarn-*``
  flags, recipe keys and run.json record of every stage (``args`` adds them to a parser).
- ``hf``: the one adapter that writes a spec into / reads it from an HF config (transformers 4.x and 5.x).
- ``describe``: ``python -m rope_scaling describe`` explains a setting per rotary dimension pair.
- ``search``: LongRoPE's evolutionary search of per-pair factors, model-free (``python -m rope_scaling search``,
  ``ropescale.probes.rope_search``, wires a model to it).
"""
from ropescale.common.io import InputError

from .args import add_rope_args, spec_from_args
from .formulas import REGISTRY, Freqs, frequencies
from .hf import RopeChange, RopeState, apply_rope, extended_context, plan_rope, read_rope, rope_state
from .spec import METHODS, RopeSpec

__all__ = ["RopeSpec", "add_rope_args", "spec_from_args", "apply_rope", "read_rope", "extended_context",
           "InputError", "METHODS", "REGISTRY", "Freqs", "frequencies", "rope_state", "RopeState", "plan_rope",
           "RopeChange"]
