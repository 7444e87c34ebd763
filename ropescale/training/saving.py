"""Saving what was trained (ZeRO-aware) and merging it into a full model.

An export directory holds:
- ``adapter_config.json`` + ``adapter_model.safetensors``: the LoRA adapter (PEFT format);
- ``trained_tensors.safetensors``: the trained embedding and norm weights, named as in the base causal LM;
- ``config.json``: the base model's config with the RoPE setting applied (what inference must use);
- the tokenizer files; ``export.json``: base model path, rope spec, step, the extra tensor names, and the run's
  training record (``train``: ``ropescale.common.runs``).

A merged model directory (:func:`merge`) is a plain HF model whose config carries the RoPE setting, with the
training record in ``ropescale_train.json`` (``runs.TRAIN_JSON``: the run's id, the step, the RoPE spec, the data
and its length mean/min/max, the steps, the base model and its id, and ``coverage``: the position ids the run
trained up to that export, ``positions.Coverage``), written inside the same atomic rename as the
weights: every run that reads the model records it, wherever the model is moved.

Under DeepSpeed ZeRO-3 every rank holds a slice of each parameter (``p.numel() == 0`` outside a gather); the
tensors are gathered with ``deepspeed.zero.GatheredParameters`` (all ranks take part) and written by rank 0.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import torch

from ropescale.common import compat
from ropescale.common.io import InputError, atomic_dir, check_output_dir, write_json_atomic
from ropescale.common.runs.identity import TRAIN_JSON
from ropescale.common.runs.record import RunMeta

ADAPTER_FILE = "adapter_model.safetensors"
TRAINED_FILE = "trained_tensors.safetensors"
EXPORT_JSON = "export.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json")


def gather_trainable(model) -> dict[str, torch.Tensor]:
    """Full CPU copies of every trainable parameter of ``model`` (a PEFT model), by name; under ZeRO-3 all ranks
    must call this (collective gather)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    z3 = [p for _, p in named if compat.is_zero3_param(p)]
    out: dict[str, torch.Tensor] = {}
    if z3:
        with compat.zero3_gathered(z3, modifier_rank=None):
            for n, p in named:
                out[n] = p.detach().to("cpu", copy=True).contiguous()
    else:
        for n, p in named:
            out[n] = p.detach().to("cpu", copy=True).contiguous()
    for n, t in out.items():
        if t.numel() == 0:
            raise RuntimeError(f"gathered parameter {n} is empty (ZeRO-3 gather failed)")
    return out


def split_trainable(state: dict[str, torch.Tensor], extra_names: list[str]) -> tuple[dict, dict]:
    """(LoRA tensors with PEFT's full names, extra tensors named relative to the causal LM)."""
    prefix = compat.PEFT_PREFIX
    extra_set = set(extra_names)
    lora, extra = {}, {}
    for n, t in state.items():
        rel = n[len(prefix):] if n.startswith(prefix) else n
        if rel in extra_set:
            extra[rel] = t
        else:
            lora[n] = t
    missing = extra_set - set(extra)
    if missing:
        raise RuntimeError(f"trained tensors missing from the model: {sorted(missing)[:5]}")
    return lora, extra


def export(model, out_dir: str | os.PathLike, *, extra_names: list[str], base_model: str, config, rope: dict,
           step: int | None, tokenizer_dir: str | os.PathLike | None, is_main: bool = True,
           train: dict | None = None) -> Path | None:
    """Write the export directory (see module doc) atomically; collective under ZeRO-3 (call on all ranks)."""
    from safetensors.torch import save_file

    state = gather_trainable(model)
    if not is_main:
        return None
    lora, extra = split_trainable(state, extra_names)
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), state_dict=lora, safe_serialization=True)
        save_file({k: v.clone() for k, v in extra.items()}, str(tmp / TRAINED_FILE), metadata={"format": "pt"})
        config.save_pretrained(str(tmp))
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                f = Path(tokenizer_dir) / name
                if f.is_file():
                    shutil.copy(f, tmp / name)
        write_json_atomic(tmp / EXPORT_JSON, {"base_model": str(base_model), "rope": rope, "step": step,
                                              "trained_tensors": sorted(extra), "lora_tensors": len(lora),
                                              "train": None if train is None else {**train, "step": step}})
    return out


def check_merge_out(out: Path, *, protect: dict[str, Path], overwrite: bool = False) -> None:
    """``merge --out``: a new path or an empty directory; an existing model directory only with ``overwrite``
    (then replaced atomically); never a file, another directory, or one of the inputs (``protect``: what -> path).
    Checked before any work."""
    from ropescale.common.models import check_model_dir

    for what, p in protect.items():
        if p is not None and out.resolve() == Path(p).resolve():
            raise InputError(f"--out is {what}; merging would replace it: pick another --out", out)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise InputError("--out exists and is not a directory (a file): pick another --out", out)
        if any(out.iterdir()):
            try:
                check_model_dir(out)
            except InputError:
                raise InputError("--out is an existing directory that is not a model directory (it would be "
                                 "replaced): pick a new or empty directory", out) from None
            if not overwrite:
                raise InputError("--out is an existing model directory: pass --overwrite to replace it, or pick a "
                                 "new --out", out)
    check_output_dir(out, "--out")


def find_export(run_dir: str | os.PathLike, step: int | None = None) -> Path:
    """The export of a finetune run: the final one, or that of checkpoint ``step``."""
    run = Path(run_dir)
    if not run.exists():
        raise InputError("no such finetune run directory", run)
    if not run.is_dir():
        raise InputError("is a file, expected a finetune run directory (or one of its export directories)", run)
    cand = run / "final" if step is None else run / f"checkpoint-{step}" / "export"
    if not (cand / EXPORT_JSON).is_file():
        if step is None and (run / EXPORT_JSON).is_file():
            return run
        have = sorted(int(p.parent.parent.name.split("-")[1])
                      for p in run.glob("checkpoint-*/export/" + EXPORT_JSON))
        what = ("a finetune run directory" if (run / "run.json").is_file() else
                "not a finetune run directory (no run.json)")
        raise InputError(f"{what} with no {'final export' if step is None else f'export of step {step}'} "
                         f"(checkpoints with exports: {have or 'none'})", run)
    return cand


def load_export_into(peft_model, export_dir: str | os.PathLike) -> None:
    """Initialise a freshly wrapped PEFT model from an export (LoRA + extra tensors): for continued training."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    d = Path(export_dir)
    adapter = load_file(str(d / ADAPTER_FILE))
    res = set_peft_model_state_dict(peft_model, adapter)
    unexpected = compat.peft_unexpected_keys(res)
    if unexpected:
        raise InputError(f"adapter does not fit the model (unexpected {unexpected[:3]})", d)
    extra = load_file(str(d / TRAINED_FILE))
    params = dict(peft_model.get_base_model().named_parameters())
    for n in extra:
        if n not in params:
            raise InputError(f"trained tensor {n} is not in the model", d / TRAINED_FILE)
    z3 = [params[n] for n in extra if compat.is_zero3_param(params[n])]
    if z3:  # partitioned by ZeRO-3 while loading: gather, write, re-partition (all ranks call this)
        ctx = compat.zero3_gathered(z3, modifier_rank=0)
    else:
        ctx = contextlib.nullcontext()
    with ctx, torch.no_grad():
        for n, t in extra.items():
            params[n].copy_(t.to(params[n].dtype))


def training_record(export_dir: Path, info: dict) -> dict:
    """The training record a merge of ``export_dir`` carries: the one its export.json holds, or for an export
    written by an older version, what its run's run.json says (the run is ``final/``'s or ``checkpoint-N/export``'s
    parent); its id is then a hash of export.json (the same export always gets the same id)."""
    import hashlib

    rec = info.get("train")
    if not isinstance(rec, dict):
        run = export_dir.parent if export_dir.name == "final" else export_dir.parent.parent
        meta = RunMeta.find(run)
        rec = dict(meta.train or {}) if meta is not None and meta.kind == "finetune" else {}
        for k in ("rope", "base_model"):
            if rec.get(k) is None:
                rec[k] = info.get(k)
    if not rec.get("id"):
        rec["id"] = hashlib.sha256((export_dir / EXPORT_JSON).read_bytes()).hexdigest()[:16]
    return {**rec, "step": info.get("step")}


def merge(export_dir: str | os.PathLike, out_dir: str | os.PathLike, *, base_model: str | None = None,
          dtype: str = "auto", overwrite: bool = False) -> Path:
    """Base model + trained tensors + LoRA merged into a plain HF model (safetensors) whose config carries the
    RoPE setting, and the training record (``ropescale_train.json``); written atomically. ``out_dir`` is checked
    first (:func:`check_merge_out`): a file, a directory that is not a model, an existing model without
    ``overwrite``, the run, its export or the base model are refused before any work."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from rope_scaling.load import load_config, load_model

    d = Path(export_dir)
    out = Path(out_dir)
    protect = {"the export being merged": d, "the run directory": d.parent if d.name == "final" else None}
    check_merge_out(out, protect=protect, overwrite=overwrite)
    try:
        info = json.loads((d / EXPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"unreadable export record: {e}", d / EXPORT_JSON) from None
    base = Path(base_model or info["base_model"])
    check_merge_out(out, protect={**protect, "the base model": base}, overwrite=overwrite)
    if not (base / "config.json").is_file():
        raise InputError("base model of the run not found (pass --base-model)", base)
    trained = load_config(d)  # the trained config: rope applied
    config = trained.config
    if dtype == "auto":
        torch_dtype = compat.config_dtype(config) or torch.float32
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
    else:
        from .model import resolve_dtype

        torch_dtype = resolve_dtype(dtype, False)
    model = load_model(base, config, dtype=torch_dtype, state=trained.state)
    extra = load_file(str(d / TRAINED_FILE))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in extra.items():
            if n not in params:
                raise InputError(f"trained tensor {n} is not in the base model", d / TRAINED_FILE)
            params[n].copy_(t.to(params[n].dtype))
    train = training_record(d, info)
    model = PeftModel.from_pretrained(model, str(d), **compat.peft_keep_dtype())
    model = model.merge_and_unload()
    with atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for name in TOKENIZER_FILES:
            f = d / name
            if f.is_file():
                shutil.copy(f, tmp / name)
        write_json_atomic(tmp / TRAIN_JSON, {**train, "merged": {"export": str(d.resolve()),
                                                                 "base_model": str(base.resolve()), "dtype": dtype}})
    return out
