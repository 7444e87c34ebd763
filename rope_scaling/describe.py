"""``python -m rope_scaling describe``: what a RoPE setting does to each rotary dimension pair.

A config that already carries RoPE scaling follows the one rule of ``rope_scaling.apply_rope``: the same
setting again changes nothing, another one needs --replace (then it replaces the carried one); the report says
which happened ("setting: ...", ``rope_change`` in --json).

For every pair i: its wavelength in tokens (2*pi / inv_freq), the original and scaled inv_freq, their ratio, and a
kind -- ``extrapolated`` (frequency unchanged), ``interpolated`` (divided by exactly s) or ``mixed`` (anything else),
all at relative tolerance 1e-6. "Original" is the model's own RoPE (its own base, no scaling); "scaled" is what the
model computes after the spec is applied through the same adapter that writes real configs.

The predicted reach (``rope_scaling.formulas.reach``) is the longest context in which every pair stays inside the
angles it turned through over the original context: only pairs whose wavelength exceeds the original context
(they never completed a turn in pre-training) bound it, each at orig-ctx x its ratio; the first of them to leave
its range sets the reach. It counts angles only: a fine-tune can teach a model more, attention may fail sooner.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

from ropescale.common.cli import Tool, add_alias, add_command, add_json
from ropescale.common.io import InputError, read_json

from .args import add_rope_args, spec_from_args
from .formulas import reach, yarn_correction_range
from .hf import change_rope, extended_context
from .spec import RopeSpec

REL_TOL = 1e-6


def _preset(hidden: int, heads: int, base: float, max_pos: int, model_type: str, rope: dict | None = None) -> dict:
    return {"model_type": model_type, "hidden_size": hidden, "num_attention_heads": heads,
            "head_dim": hidden // heads, "max_position_embeddings": max_pos,
            "rope_parameters": {"rope_type": "default", "rope_theta": base, **(rope or {})}}


# Real values from each model's config.json on the Hub (the base models, not their -Instruct / -Chat variants).
PRESETS: dict[str, dict] = {
    "llama2-7b": _preset(4096, 32, 10000.0, 4096, "llama"),
    "yi-6b": _preset(4096, 32, 5000000.0, 4096, "llama"),
    "qwen1.5-7b": _preset(4096, 32, 1000000.0, 32768, "qwen2"),
    "qwen2-7b": _preset(3584, 28, 1000000.0, 131072, "qwen2"),  # the base model (Qwen2-7B-Instruct: 32768)
    "mistral-7b": _preset(4096, 32, 10000.0, 32768, "mistral"),
    "llama3.1-8b": _preset(4096, 32, 500000.0, 131072, "llama",
                           {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}),
}


def load_config(path: str | Path) -> dict:
    """config.json (or a model dir holding one) as a dict."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("no such config.json", p)
    return read_json(p, "config.json")


def classify(orig: float, scaled: float, s: float) -> str:
    """extrapolated (unchanged) / interpolated (divided by exactly s) / mixed, at relative tolerance 1e-6."""
    if math.isclose(scaled, orig, rel_tol=REL_TOL):
        return "extrapolated"
    if math.isclose(scaled * s, orig, rel_tol=REL_TOL):
        return "interpolated"
    return "mixed"


def describe(cfg, spec: RopeSpec | None = None, seq_len: int | None = None) -> dict:
    """The per-pair explanation of ``spec`` applied to ``cfg`` (a config object or dict, not modified).
    With ``spec`` None (or method none), what the config itself carries is described."""
    cfg = copy.deepcopy(cfg)
    change, st = change_rope(cfg, spec if spec is not None else RopeSpec())  # the one rule (InputError: stacking)
    sp = st.spec
    ext = extended_context(cfg, st)
    if seq_len is None:
        seq_len = ext
    if seq_len < 1:
        raise InputError(f"--seq-len must be >= 1, got {seq_len}")
    orig = st.original_frequencies()
    new = st.frequencies(seq_len)
    dims, counts = [], {"extrapolated": 0, "mixed": 0, "interpolated": 0}
    for i, (a, b) in enumerate(zip(orig.inv_freq, new.inv_freq)):
        kind = classify(a, b, sp.scale)
        counts[kind] += 1
        pair_reach = reach(st.orig_ctx, [a], [b])  # inf: the pair turned full circles in pre-training
        dims.append({"index": i, "wavelength": 2 * math.pi / a, "wavelength_scaled": 2 * math.pi / b,
                     "inv_freq": a, "inv_freq_scaled": b, "ratio": a / b, "kind": kind,
                     "reach": None if math.isinf(pair_reach) else pair_reach})
    total = reach(st.orig_ctx, orig.inv_freq, new.inv_freq)
    bounded = [r["index"] for r in dims if r["reach"] is not None]
    out = {"rope": sp.method, "scale": sp.scale, "base": st.base, "rope_base": sp.rope_base,
           "effective_base": new.base, "attention_factor": new.attention_factor, "head_dim": st.rotary_dim,
           "orig_ctx": st.orig_ctx, "extended_context": ext, "seq_len": seq_len, "counts": counts,
           "reach": None if math.isinf(total) else total,
           "reach_pair": min(bounded, key=lambda i: dims[i]["reach"]) if bounded else None,
           "bounded_pairs": bounded, "rope_change": change.to_dict()}
    if sp.method == "yarn":
        b = sp.rope_base if sp.rope_base is not None else st.base
        low, high = yarn_correction_range(st.rotary_dim, b, st.orig_ctx, sp.yarn_beta, sp.yarn_alpha)
        out["yarn"] = {"alpha": sp.yarn_alpha, "beta": sp.yarn_beta, "ramp_low": low, "ramp_high": high}
    out["dims"] = dims
    return out


def format_table(d: dict) -> str:
    """A readable report: a summary line, the counts, one row per pair."""
    lines = [f"rope {d['rope']}  scale {d['scale']:g}  base {d['base']:g}  effective base {d['effective_base']:.6g}  "
             f"attention factor {d['attention_factor']:.6g}",
             f"head_dim {d['head_dim']}  original context {d['orig_ctx']}  extended context {d['extended_context']}"
             + (f"  (dynamic NTK at seq_len {d['seq_len']})" if d["rope"] == "dynamic_ntk" else ""),
             f"setting: {d['rope_change']['message']}"]
    if "yarn" in d:
        y = d["yarn"]
        lines.append(f"yarn alpha {y['alpha']:g} beta {y['beta']:g}: ramp between pair {y['ramp_low']} and "
                     f"{y['ramp_high']}")
    c = d["counts"]
    lines.append(f"pairs: {c['extrapolated']} extrapolated (unchanged), {c['mixed']} mixed, "
                 f"{c['interpolated']} interpolated (/ s)")
    lines.append(reach_line(d))
    lines.append("")
    lines.append(f"{'pair':>4}  {'wavelength':>12}  {'inv_freq':>12}  {'scaled':>12}  {'ratio':>9}  {'reach':>9}  kind")
    for r in d["dims"]:
        pr = "-" if r["reach"] is None else f"{r['reach']:.0f}"
        lines.append(f"{r['index']:>4}  {r['wavelength']:>12.1f}  {r['inv_freq']:>12.6g}  {r['inv_freq_scaled']:>12.6g}"
                     f"  {r['ratio']:>9.4f}  {pr:>9}  {r['kind']}")
    return "\n".join(lines)


def reach_line(d: dict) -> str:
    """The predicted reach in words (for the table)."""
    b = d["bounded_pairs"]
    if d["reach"] is None:
        return (f"predicted reach: unbounded (every pair turned a full circle within the original context of "
                f"{d['orig_ctx']})")
    at = f" (dynamic NTK: its frequencies at seq_len {d['seq_len']})" if d["rope"] == "dynamic_ntk" else ""
    return (f"predicted reach: {d['reach']:.0f} tokens{at}: pairs {b[0]}-{b[-1]} (wavelength > {d['orig_ctx']}) never "
            f"turned a full circle in pre-training; pair {d['reach_pair']} is the first to leave the angles it saw "
            f"(orig-ctx x its ratio)")


def add_describe_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_argument_group("the model (exactly one of: --config, --preset, or --head-dim + --rope-theta + "
                               "--orig-ctx)")
    src.add_argument("--config", metavar="PATH", help="an HF config.json, or a model directory holding one")
    src.add_argument("--preset", choices=sorted(PRESETS), help="a known model's RoPE (base, context, head_dim)")
    src.add_argument("--head-dim", type=int, metavar="D",
                     help="rotary head dimension (with --rope-theta and --orig-ctx)")
    src.add_argument("--rope-theta", dest="base", type=float, metavar="B",
                     help="the model's own RoPE base, its config's rope_theta (with --head-dim); not --rope-base, "
                          "the new base of ABF")
    add_alias(p, "--rope-theta", "--base", dest="base", type=float)
    add_rope_args(p)  # adds --orig-ctx too: the original context of the model, or of the --head-dim model
    p.add_argument("--seq-len", type=int, metavar="L",
                   help="sequence length for dynamic_ntk; default: the extended context, orig-ctx x s")
    add_json(p, "the explanation instead of the table")
    return p


def register(sub) -> None:
    p = add_command(sub, "describe", help="explain a RoPE setting per rotary dimension pair",
                    description=__doc__.split("\n\n", 1)[1].strip())
    add_describe_args(p)
    p.set_defaults(func=cmd_describe)


def config_from_args(args: argparse.Namespace):
    """The config dict the source flags name (InputError unless exactly one source is given)."""
    manual = args.head_dim is not None or args.base is not None
    n = sum([args.config is not None, args.preset is not None, manual])
    if n != 1:
        raise InputError("give exactly one model: --config PATH, --preset NAME, or --head-dim D --rope-theta B "
                         "--orig-ctx N")
    if args.config is not None:
        return load_config(args.config)
    if args.preset is not None:
        return copy.deepcopy(PRESETS[args.preset])
    if args.head_dim is None or args.base is None or args.orig_ctx is None:
        raise InputError("--head-dim, --rope-theta and --orig-ctx go together")
    if args.head_dim < 4 or args.head_dim % 2:
        raise InputError(f"--head-dim must be an even number >= 4, got {args.head_dim}")
    if not args.base > 1:
        raise InputError(f"--rope-theta must be > 1, got {args.base:g}")
    return {"head_dim": args.head_dim, "max_position_embeddings": args.orig_ctx,
            "rope_parameters": {"rope_type": "default", "rope_theta": args.base}}


def cmd_describe(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    spec = spec_from_args(args)
    d = describe(cfg, spec, args.seq_len)
    text = json.dumps(d, indent=1) if args.json else format_table(d)
    sys.stdout.write(text + "\n")
    return 0


TOOL = Tool("python -m rope_scaling describe", __doc__, (register,), single=True)  # also `rope_scaling describe`
build_parser = TOOL.parser
main = TOOL.entry()
