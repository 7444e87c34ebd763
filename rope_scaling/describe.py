"""``python -m rope_scaling describe``: what a RoPE setting does to each rotary dimension pair.

A config that already carries RoPE scaling follows the one rule of ``rope_scaling.apply_rope``: the same
setting again changes nothing, another one needs --replace (then it replaces the carried one); the report says
which happened ("setting: ...", ``rope_change`` in --json).

For every pair i: its wavelength in tokens (2*pi / inv_freq), the original and scaled inv_freq, their ratio, and a
kind -- ``extrapolated`` (frequency unchanged), ``interpolated`` (divided by exactly s) or ``mixed`` (anything else),
all at relative tolerance 1e-6. "Original" is the model's own RoPE (its own base, no scaling); "scaled" is what the
model computes after the spec is applied through the same adapter that writes real configs.

The angle bound (``rope_scaling.bounds.reach``) is the longest context in which every pair stays inside the
angles it turned through over the original context: only pairs whose wavelength exceeds the original context
(they never completed a turn in pre-training) bound it, each at orig-ctx x its ratio; the first of them to leave
its range sets it. A necessary condition, not a prediction: it counts angles only, and attention may fail much
sooner. A fine-tune moves it (``bounds.finetune_bound``: the angles seen up to the trained length count too):
``--trained-length N``, or what the model directory's training record says (``ropescale_train.json``: the longest
trained distance of its coverage when recorded, else the longest sample). For a method that changes the base (ntk,
dynamic_ntk, abf, --rope-base) Liu et al. 2023's critical dimension d_extra and its full period T_extra under the new
base are shown too (``bounds.critical_dimension`` / ``critical_period``), and for a bound at or past the original
context the ABF base that has the same bound (``bounds.matched_base``).

Methods that follow the length are shown at ``--seq-len`` (default: the extended context): dynamic NTK's base,
dynamic YaRN's scale max(1, L / orig), and which of LongRoPE's factor sets applies (short within the original
context, long past it), with the factors' content hash and the file they came from.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

from ropescale.common.cli import Tool, add_alias, add_command, add_json
from ropescale.common.io import InputError

from .args import add_rope_args, spec_from_args
from .bounds import critical_dimension, critical_period, finetune_bound, matched_base, reach
from .formulas import REGISTRY
from .hf import change_rope, extended_context, layer_types
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
    """config.json (or a model dir holding one, or a GGUF file: the directory it converts to) as a dict."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf":
        from ropescale.common.gguf import cached_dir

        p = cached_dir(p)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("no such config.json", p)
    from ropescale.common.models import check_config

    return check_config(p)  # a config that is not a model config is one line naming the file and the key


def classify(orig: float, scaled: float, s: float) -> str:
    """extrapolated (unchanged) / interpolated (divided by exactly s) / mixed, at relative tolerance 1e-6."""
    if math.isclose(scaled, orig, rel_tol=REL_TOL):
        return "extrapolated"
    if math.isclose(scaled * s, orig, rel_tol=REL_TOL):
        return "interpolated"
    return "mixed"


def describe(cfg, spec: RopeSpec | None = None, seq_len: int | None = None,
             trained_length: float | None = None) -> dict:
    """The per-pair explanation of ``spec`` applied to ``cfg`` (a config object or dict, not modified).
    With ``spec`` None (or method none), what the config itself carries is described. ``trained_length``: the
    longest distance a fine-tune trained the setting at (adds the fine-tune-aware bound)."""
    cfg = copy.deepcopy(cfg)
    change, st = change_rope(cfg, spec if spec is not None else RopeSpec())  # the one rule (InputError: stacking)
    sp = st.spec
    ext = extended_context(cfg, st)
    if seq_len is None:
        seq_len = ext
    if seq_len < 1:
        raise InputError(f"--seq-len must be >= 1, got {seq_len}")
    if trained_length is not None and not trained_length >= 1:
        raise InputError(f"--trained-length must be >= 1, got {trained_length:g}")
    orig = st.original_frequencies()
    new = st.frequencies(seq_len)
    dims, counts = [], {"extrapolated": 0, "mixed": 0, "interpolated": 0}
    method = REGISTRY[sp.method]
    s_now = method.scale_at_length(sp, st.orig_ctx, seq_len)  # its s at seq_len
    for i, (a, b) in enumerate(zip(orig.inv_freq, new.inv_freq)):
        kind = classify(a, b, s_now)
        counts[kind] += 1
        pair_reach = reach(st.orig_ctx, [a], [b])  # inf: the pair turned full circles in pre-training
        dims.append({"index": i, "wavelength": _wavelength(a), "wavelength_scaled": _wavelength(b),
                     "inv_freq": a, "inv_freq_scaled": b, "ratio": a / b if b else 1.0, "kind": kind,
                     "reach": None if math.isinf(pair_reach) else pair_reach})
    total = reach(st.orig_ctx, orig.inv_freq, new.inv_freq)
    bounded = [r["index"] for r in dims if r["reach"] is not None]
    out = {"rope": sp.method, "label": sp.label(), "scale": sp.scale, "base": st.base, "rope_base": sp.rope_base,
           "effective_base": new.base, "attention_factor": new.attention_factor, "head_dim": st.rotary_dim,
           "orig_ctx": st.orig_ctx, "extended_context": ext, "seq_len": seq_len, "counts": counts,
           "reach": _finite(total),
           "reach_pair": min(bounded, key=lambda i: dims[i]["reach"]) if bounded else None,
           "bounded_pairs": bounded, "rope_change": change.to_dict()}
    out["bound"] = bounds(st, orig.inv_freq, new, total, trained_length)
    if method.describe.details is not None:  # what the method adds (its own section)
        out.update(method.describe.details(st, seq_len))
    if sp.attention_extend != "none":  # an attention-level method: its positions, not the frequencies above
        out["attention_extend"] = attention_details(sp, st.orig_ctx)
    types = layer_types(cfg)  # a per-layer-type config: the pairs below are the full_attention layers'
    if types:
        out["layer_types"] = {t: {"layers": i["layers"], "window": i["window"], "rope_type": i["entries"]["rope_type"],
                                  "rope_theta": i["entries"]["rope_theta"], "factor": i["entries"].get("factor")}
                              for t, i in types.items()}
    out["dims"] = dims
    return out


def attention_details(sp: RopeSpec, orig_ctx: int) -> dict:
    """The attention-level method of a spec (``ropescale.common.attention_extend``): its sizes and the longest
    context its relative positions stay inside the original context for."""
    from ropescale.common.attention_extend import max_context, rule_of

    rule = rule_of(sp.attention_extend, group=sp.grp_attn_n, window=sp.grp_attn_w, chunk_size=sp.dca_chunk_size,
                   local_size=sp.dca_local_size, orig_ctx=orig_ctx)
    return {"method": rule.method, **rule.params,
            "max_context": _finite(max_context(rule, orig_ctx))}


def _wavelength(f: float) -> float | None:
    """2*pi / inv_freq in tokens; None for a pair that does not rotate (proportional rope's zero frequencies)."""
    return 2 * math.pi / f if f else None


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


def bounds(st, inv_freq, new, pretrain: float, trained_length: float | None) -> dict:
    """The angle bounds of a setting: pre-training (:func:`bounds.reach`), after a fine-tune at
    ``trained_length`` (:func:`bounds.finetune_bound`), and for a changed base (``Method.changes_base``, or a
    --rope-base) Liu et al.'s d_extra / T_extra; the ABF base matched to the pre-training bound
    (:func:`bounds.matched_base`) where one is."""
    b = {"pretrain": _finite(pretrain), "trained_length": trained_length,
         "finetune": None if trained_length is None else
         _finite(finetune_bound(st.orig_ctx, inv_freq, new.inv_freq, trained_length))}
    if REGISTRY[st.spec.method].changes_base or st.spec.rope_base is not None:
        de = critical_dimension(st.rotary_dim, st.base, st.orig_ctx)
        b["critical"] = {"d_extra": de, "T_extra": _finite(critical_period(st.rotary_dim, st.base, new.base,
                                                                           st.orig_ctx))}
    if b["pretrain"] is not None and b["pretrain"] >= st.orig_ctx:  # the ABF base with the same bound
        try:
            b["matched_base"] = matched_base(st.orig_ctx, st.rotary_dim, st.base, b["pretrain"])
        except ValueError:  # no base moves the bound there (the first pair bounds it, or none is bounded)
            pass
    return b


def format_table(d: dict) -> str:
    """A readable report: a summary line, the counts, one row per pair."""
    lines = [f"rope {d['label']}  base {d['base']:g}  effective base {d['effective_base']:.6g}  "
             f"attention factor {d['attention_factor']:.6g}",
             f"head_dim {d['head_dim']}  original context {d['orig_ctx']}  extended context {d['extended_context']}"
             + _at_seq_len(d), f"setting: {d['rope_change']['message']}"]
    lines += (REGISTRY[d["rope"]].describe.lines or (lambda _: []))(d)  # the method's own lines
    for t, i in (d.get("layer_types") or {}).items():
        win = f", window {i['window']}" if i["window"] else ""
        fac = f", factor {i['factor']:g}" if i["factor"] is not None else ""
        shown = "  <- the pairs below" if t == next(iter(d["layer_types"])) else ""
        lines.append(f"layer type {t} ({i['layers']} layers{win}): {i['rope_type']}, rope_theta {i['rope_theta']:g}"
                     f"{fac}{shown}")
    if "attention_extend" in d:
        a = d["attention_extend"]
        sizes = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in a.items() if k not in ("method", "max_context"))
        reach_ = "any length" if a["max_context"] is None else f"{a['max_context']:.0f} tokens"
        lines.append(f"attention: {a['method']} ({sizes}) on top of the frequencies below: relative positions stay "
                     f"within the original context up to {reach_} (docs/rope_methods.md)")
    c = d["counts"]
    lines.append(f"pairs: {c['extrapolated']} extrapolated (unchanged), {c['mixed']} mixed, "
                 f"{c['interpolated']} interpolated (/ s)")
    lines += bound_lines(d)
    lines.append("")
    lines.append(f"{'pair':>4}  {'wavelength':>12}  {'inv_freq':>12}  {'scaled':>12}  {'ratio':>9}  {'bound':>9}  kind")
    for r in d["dims"]:
        pr = "-" if r["reach"] is None else f"{r['reach']:.0f}"
        wl = "-" if r["wavelength"] is None else f"{r['wavelength']:.1f}"
        lines.append(f"{r['index']:>4}  {wl:>12}  {r['inv_freq']:>12.6g}  {r['inv_freq_scaled']:>12.6g}"
                     f"  {r['ratio']:>9.4f}  {pr:>9}  {r['kind']}")
    return "\n".join(lines)


def _at_seq_len(d: dict) -> str:
    """How a method that follows the length is shown at --seq-len (the table's frequencies are those)."""
    at = REGISTRY[d["rope"]].describe.at
    return "" if at is None else at(d)


def bound_lines(d: dict) -> list[str]:
    """The angle bounds in words (for the table)."""
    b = d["bounded_pairs"]
    at = f" (at seq_len {d['seq_len']})" if REGISTRY[d["rope"]].by_length else ""
    if d["reach"] is None:
        lines = [f"angle bound: none (every pair turned a full circle within the original context of "
                 f"{d['orig_ctx']})"]
    else:
        lines = [f"angle bound (pre-training): {d['reach']:.0f} tokens{at}: pairs {b[0]}-{b[-1]} (wavelength > "
                 f"{d['orig_ctx']}) never turned a full circle in pre-training; pair {d['reach_pair']} is the first "
                 f"to leave the angles it saw (orig-ctx x its ratio). A necessary condition, not a prediction"]
    bd = d["bound"]
    if bd["trained_length"] is not None:
        ft = "none" if bd["finetune"] is None else f"{bd['finetune']:.0f} tokens"
        lines.append(f"angle bound after a fine-tune at {bd['trained_length']:g} tokens: {ft} (the angles seen up to "
                     f"the trained length count too)")
    if "critical" in bd:
        c = bd["critical"]
        te = "inf" if c["T_extra"] is None else f"{c['T_extra']:.0f}"
        lines.append(f"Liu et al. 2023 (changed base): critical dimension d_extra {c['d_extra']} of {d['head_dim']}, "
                     f"its full period under the new base T_extra {te} tokens")
    if "matched_base" in bd:
        lines.append(f"ABF matched to this bound: base {bd['matched_base']:.6g} (bounds.matched_base)")
    return lines


def add_describe_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_argument_group("the model (exactly one of: --config, --preset, or --head-dim + --rope-theta + "
                               "--orig-ctx)")
    src.add_argument("--config", metavar="PATH", help="an HF config.json, or a model directory holding one")
    src.add_argument("--model", dest="config", metavar="PATH", help=argparse.SUPPRESS)  # the other commands' name
    src.add_argument("--preset", choices=sorted(PRESETS), help="a known model's RoPE (base, context, head_dim)")
    src.add_argument("--head-dim", type=int, metavar="D",
                     help="rotary head dimension (with --rope-theta and --orig-ctx)")
    src.add_argument("--rope-theta", dest="base", type=float, metavar="B",
                     help="the model's own RoPE base, its config's rope_theta (with --head-dim); not --rope-base, "
                          "the new base of ABF")
    add_alias(p, "--rope-theta", "--base", dest="base", type=float)
    add_rope_args(p)  # adds --orig-ctx too: the original context of the model, or of the --head-dim model
    p.add_argument("--seq-len", type=int, metavar="L",
                   help="sequence length for the methods that follow it (dynamic_ntk, dynamic_yarn, and longrope's "
                        "short / long factor set); default: the extended context, orig-ctx x s")
    p.add_argument("--trained-length", type=float, metavar="N",
                   help="the longest distance a fine-tune trained this setting at: adds the fine-tune-aware angle "
                        "bound; default: a model directory's training record (ropescale_train.json: the coverage's "
                        "longest distance, else the longest sample), else none")
    add_json(p, "the explanation instead of the table")
    return p


def register(sub) -> None:
    from .formulas import REGISTRY

    user = {n: m for n, m in REGISTRY.items() if m.user}  # --rope's choices (a type read from configs only: not one)
    width = max(map(len, user))
    methods = "--rope's methods:\n" + "\n".join(f"  {n:<{width}}  {m.help}" for n, m in user.items())
    p = add_command(sub, "describe", help="explain a RoPE setting per rotary dimension pair",
                    description=__doc__.split("\n\n", 1)[1].strip(), epilog=methods)
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


def trained_length_of(args: argparse.Namespace) -> float | None:
    """``--trained-length``, else the training record of the ``--config`` model directory
    (:func:`ropescale.common.runs.identity.trained_distance`), else None."""
    if args.trained_length is not None or args.config is None or not Path(args.config).is_dir():
        return args.trained_length
    from ropescale.common.runs.identity import TRAIN_JSON, trained_distance
    from ropescale.common.runs.record import read_train_record

    return trained_distance(read_train_record(args.config), Path(args.config) / TRAIN_JSON)


def cmd_describe(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    spec = spec_from_args(args)  # warns on stderr past the method's published range
    d = describe(cfg, spec, args.seq_len, trained_length_of(args))
    text = json.dumps(d, indent=1) if args.json else format_table(d)
    sys.stdout.write(text + "\n")
    return 0


TOOL = Tool("python -m rope_scaling describe", __doc__, (register,), single=True)  # also `rope_scaling describe`
build_parser = TOOL.parser
main = TOOL.entry()
