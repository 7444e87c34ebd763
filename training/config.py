"""Training settings: one table of keys (defaults + help), recipes (YAML) and CLI flags on top of each other.

Precedence: built-in defaults < recipe (``--recipe FILE``; for the tiny default model without a recipe,
``recipes/tiny_demo.yaml``) < flags given on the command line. A recipe key that is not in :data:`FIELDS` or the
shared RoPE flags, or a value of the wrong type or out of range, is an error naming the file and line; the
resolved settings are checked again (:func:`validate_settings`, naming the flag) before any work.
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.paths import REPO_ROOT
from common.io import InputError

RECIPES_DIR = REPO_ROOT / "recipes"
DS_CONFIGS_DIR = REPO_ROOT / "ds_configs"
TINY_DEMO_RECIPE = RECIPES_DIR / "tiny_demo.yaml"
ROPE_KEYS = ("rope", "scale", "rope_base", "orig_ctx", "yarn_alpha", "yarn_beta", "yarn_mscale", "replace")


@dataclass(frozen=True)
class Field:
    name: str
    default: Any
    type: Any  # int | float | str | bool | "list" | "optional_int" ...
    help: str


def _opt_int(v):
    return None if v in (None, "", "none", "None", "auto") else int(v)


def _opt_str(v):
    return None if v in (None, "", "none", "None") else str(v)


def _bool(v):
    if isinstance(v, bool):
        return v
    s = str(v).lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _list(v):
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return [x for x in re.split(r"[,\s]+", str(v)) if x]


FIELDS: tuple[Field, ...] = (
    # what to train on
    Field("model", "tiny", str, "HF model directory, or 'tiny' for the embedded tiny default (default)"),
    Field("data", None, _opt_str, "packed dataset directory (python -m data_concat pack); default: build + cache "
                                  "one from the shared novels sized for the model (tiny default only)"),
    Field("output_dir", None, _opt_str, "run directory; default runs/train/<model>-<rope>-x<scale>"),
    Field("init_from", None, _opt_str, "start from the adapter + trained tensors of another finetune run "
                                       "(e.g. the 16K run for a 32K continuation)"),
    Field("init_step", None, _opt_int, "with --init-from: use that run's checkpoint of this step (default: final)"),
    Field("allow_extrapolation", False, _bool, "allow samples longer than the RoPE-extended context "
                                               "(e.g. Yi-6B trained at 16K without scaling, Table 8)"),
    # LoRA and what else is trained
    Field("lora_r", 8, int, "LoRA rank (Sec 5: 8)"),
    Field("lora_alpha", 16, int, "LoRA alpha"),
    Field("lora_dropout", 0.05, float, "LoRA dropout"),
    Field("lora_targets", ["q_proj", "k_proj", "v_proj", "o_proj"], _list, "module names LoRA is applied to"),
    Field("train_embeddings", True, _bool, "train the input embeddings (LongLoRA; requires_grad, not "
                                           "modules_to_save)"),
    Field("train_norms", True, _bool, "train every normalization layer"),
    # optimization (Appendix B.2)
    Field("lr", 2e-5, float, "AdamW learning rate (B.2: 2e-5)"),
    Field("warmup_steps", 30, int, "linear warm-up steps (B.2: 30)"),
    Field("lr_scheduler", "constant_with_warmup", str, "HF scheduler name after warm-up"),
    Field("weight_decay", 0.0, float, "AdamW weight decay"),
    Field("max_grad_norm", 1.0, float, "gradient clipping"),
    Field("global_batch", None, _opt_int, "global batch size in samples; default 16 for data up to 24K tokens, "
                                          "8 above (B.2: 16 at 16K, 8 at 32K)"),
    Field("micro_batch", 1, int, "samples per device per forward pass"),
    Field("max_steps", 500, int, "optimizer steps"),
    Field("save_steps", 50, int, "checkpoint every N steps"),
    Field("save_total_limit", None, _opt_int, "keep at most N checkpoints (default: all)"),
    Field("logging_steps", 1, int, "log every N steps"),
    Field("seed", 42, int, "seed (data order, LoRA init, dropout)"),
    Field("deterministic", False, _bool, "deterministic kernels (torch.use_deterministic_algorithms; slower): "
                                         "bit-identical reruns"),
    # how
    Field("deepspeed", None, _opt_str, "DeepSpeed config: a JSON file or a name in ds_configs/ (zero2, "
                                       "zero2_offload, zero3, zero3_offload); default: none (plain PyTorch)"),
    Field("ds_cpu_adam", "auto", str, "with an offloading DeepSpeed config: use DeepSpeedCPUAdam (true), torch "
                                      "AdamW (false) or auto (CPUAdam on CUDA machines; torch AdamW on CPU, "
                                      "where building the op takes minutes)"),
    Field("dtype", "auto", str, "auto (bf16 on CUDA, fp32 on CPU), bf16, fp16 or fp32"),
    Field("attn", "auto", str, "attention: auto (flash_attention_2 when importable on CUDA, else sdpa), sdpa, "
                               "eager, flash_attention_2"),
    Field("gradient_checkpointing", True, _bool, "recompute activations in backward"),
    Field("offload_checkpoints", "auto", str, "copy each decoder layer's gradient-checkpoint (its input) to "
                                              "pinned CPU memory on a side stream after its forward and prefetch "
                                              "it back before its recompute: true, false or auto (on CUDA with "
                                              "gradient checkpointing when micro_batch x sample length >= 65536 "
                                              "tokens); refused when host memory cannot hold the checkpoints"),
    Field("tile_mlp", None, _opt_int, "compute each decoder layer's MLP over sequence chunks of N tokens, each "
                                      "chunk recomputed in backward, so the MLP's intermediate activations never "
                                      "exist for the whole sequence: N, 0 = off, or auto (default: the model's "
                                      "hidden size on CUDA when micro_batch x sample length >= 65536 tokens)"),
    Field("head_chunk", 4096, int, "label positions per LM-head chunk (each chunk's logits are recomputed "
                                   "in backward, so at most one chunk of logits is alive)"),
    Field("default_data_factor", 2.0, float, "tiny default data: target sample length = factor x the model's "
                                             "original context (capped by the extended context)"),
    Field("num_workers", 0, int, "data loader workers"),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
KNOWN_KEYS = tuple(FIELD_BY_NAME) + ROPE_KEYS

# Numeric settings that some values make meaningless: (test, what it must be). ``None`` (not given) always passes.
LIMITS: dict[str, tuple[Any, str]] = {
    "lora_r": (lambda v: v >= 1, ">= 1"),
    "lora_alpha": (lambda v: v > 0, "> 0"),
    "lora_dropout": (lambda v: 0 <= v < 1, ">= 0 and < 1"),
    "lr": (lambda v: v > 0, "> 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "max_grad_norm": (lambda v: v >= 0, ">= 0 (0: no clipping)"),
    "global_batch": (lambda v: v >= 1, ">= 1"),
    "micro_batch": (lambda v: v >= 1, ">= 1"),
    "max_steps": (lambda v: v >= 1, ">= 1"),
    "save_steps": (lambda v: v >= 1, ">= 1"),
    "save_total_limit": (lambda v: v >= 1, ">= 1"),
    "logging_steps": (lambda v: v >= 1, ">= 1"),
    "init_step": (lambda v: v >= 0, ">= 0"),
    "head_chunk": (lambda v: v >= 1, ">= 1"),
    "tile_mlp": (lambda v: v >= 0, ">= 0 (0: off)"),
    "default_data_factor": (lambda v: v > 0, "> 0"),
    "num_workers": (lambda v: v >= 0, ">= 0"),
}


def setting_problem(key: str, value) -> str | None:
    """What is wrong with ``value`` for setting ``key`` ("must be >= 1, got 0"), or None."""
    if key not in LIMITS or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    ok, want = LIMITS[key]
    return None if ok(value) else f"must be {want}, got {value:g}"


def validate_settings(args: argparse.Namespace) -> None:
    """The resolved numeric settings are usable (InputError naming the flag); call before any work."""
    for key in LIMITS:
        problem = setting_problem(key, getattr(args, key, None))
        if problem:
            raise InputError(f"{flag(key)} {problem}")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_train_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training (recipe keys use the same names with underscores)")
    for f in FIELDS:
        if f.type is _bool:
            g.add_argument(flag(f.name), type=_bool, nargs="?", const=True, default=f.default, metavar="BOOL",
                           help=f"{f.help} (default {f.default})")
        else:
            g.add_argument(flag(f.name), type=f.type, default=f.default,
                           help=f"{f.help} (default {f.default})")


def explicit_keys(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Destinations the user actually gave on the command line (so they override the recipe)."""
    shadow = argparse.ArgumentParser(add_help=False)
    for a in parser._actions:  # noqa: SLF001 - argparse has no public action list
        if not a.option_strings or a.dest == "help":
            continue
        kw = {"dest": a.dest, "default": argparse.SUPPRESS}
        if a.nargs == 0:
            kw["action"] = "store_const"
            kw["const"] = a.const
        else:
            kw["nargs"] = a.nargs
            if a.const is not None:
                kw["const"] = a.const
        shadow.add_argument(*a.option_strings, **kw)
    ns, _ = shadow.parse_known_args(argv)
    return set(vars(ns))


def load_recipe(path: str | Path) -> dict:
    """A recipe: a YAML mapping of known keys (an unknown key is an error naming file:line)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        alt = RECIPES_DIR / (str(path) if str(path).endswith(".yaml") else f"{path}.yaml")
        if alt.is_file():
            p = alt
        else:
            raise InputError("no such recipe", path)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise InputError(f"malformed YAML: {getattr(e, 'problem', e)}", p, None if line is None else line + 1)
    if not isinstance(data, dict):
        raise InputError("a recipe is a YAML mapping of key: value", p)
    out = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        line = _line_of(text, str(k))
        if key not in KNOWN_KEYS:
            raise InputError(f"unknown recipe key {k!r} (known: {', '.join(sorted(KNOWN_KEYS))})", p, line)
        try:
            v = _recipe_value(key, v)
        except (TypeError, ValueError) as e:
            raise InputError(f"bad value for {k!r}: {e}", p, line) from None
        problem = setting_problem(key, v)
        if problem:
            raise InputError(f"bad value for {k!r}: {problem}", p, line)
        out[key] = v
    return out


def _number(v) -> float:
    """A finite number (YAML 1.1 reads ``5e6`` without a dot as a string: numeric strings count)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a number, got {v!r}")
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {v!r}")
    return x


def _integer(v) -> int:
    """An integer: an int, an integral float (4096.0) or a string of digits; never a bool or 8.5."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise ValueError(f"expected an integer, got {v!r}")
    try:
        return int(v.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _method(v) -> str:
    from rope_scaling import METHODS

    if not isinstance(v, str) or v not in METHODS:
        raise ValueError(f"unknown RoPE method {v!r} (choose from {', '.join(METHODS)})")
    return v


def _true_false(v) -> bool:
    try:
        return _bool(v)
    except ValueError:
        raise ValueError(f"expected true or false, got {v!r}") from None


# the type of each RoPE key in a recipe (the flags' types: rope_scaling.add_rope_args); None = may be empty
ROPE_TYPES: dict[str, tuple[Any, bool]] = {
    "rope": (_method, False), "scale": (_number, False), "rope_base": (_number, True), "orig_ctx": (_integer, True),
    "yarn_alpha": (_number, False), "yarn_beta": (_number, False), "yarn_mscale": (_number, True),
    "replace": (_true_false, False),
}


def _recipe_value(key: str, v):
    """A recipe value converted to the setting's type (ValueError naming what was expected)."""
    if key in ROPE_TYPES:
        conv, optional = ROPE_TYPES[key]
    else:
        f = FIELD_BY_NAME[key]
        optional = f.default is None
        conv = {int: _integer, float: _number, bool: _true_false, _bool: _true_false,
                _opt_int: lambda x: None if x in ("", "none", "None", "auto") else _integer(x)}.get(f.type, f.type)
    if v is None:
        if optional:
            return None
        raise ValueError("needs a value")
    return conv(v)


def _line_of(text: str, key: str) -> int | None:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*{re.escape(key)}\s*:", line):
            return i
    return None


def resolve(args: argparse.Namespace, explicit: set[str], recipe_path: str | None) -> tuple[argparse.Namespace, dict]:
    """Apply the recipe under the explicit flags. Returns (args, recipe values used)."""
    from ropescale.tiny import TINY_NAMES

    if recipe_path is None and "model" not in explicit and str(args.model) in TINY_NAMES and TINY_DEMO_RECIPE.is_file():
        recipe_path = str(TINY_DEMO_RECIPE)
    recipe = load_recipe(recipe_path) if recipe_path else {}
    for k, v in recipe.items():
        if k not in explicit:
            setattr(args, k, v)
    args.recipe = str(recipe_path) if recipe_path else None
    return args, recipe


def resolve_ds_config(name: str | None) -> Path | None:
    """A DeepSpeed config path from a path or a name in ds_configs/."""
    if not name:
        return None
    p = Path(name)
    if p.is_file():
        return p
    alt = DS_CONFIGS_DIR / (name if name.endswith(".json") else f"{name}.json")
    if alt.is_file():
        return alt
    raise InputError(f"no such DeepSpeed config (a JSON file, or one of "
                     f"{', '.join(sorted(x.stem for x in DS_CONFIGS_DIR.glob('*.json')))})", name)


def default_global_batch(max_len: int) -> int:
    """Appendix B.2: global batch 16 for ~16K samples, 8 for ~32K samples (split at 24K tokens)."""
    return 16 if max_len <= 24 * 1024 else 8
