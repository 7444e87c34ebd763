"""The GPU suite's table: one row per step (result, peak GPU memory, host memory, the memory model beside the
measurement, MFU), the CNNSum wall-time estimate, the memory model's per-layer check from the cut models, and the
whole report as JSON or markdown.

Part of ``bench/gpu_suite.py`` (see its doc).
"""
from __future__ import annotations

from pathlib import Path

from .plan import FIT_LAYERS, GEN_SUBSETS, Step
from .runner import FINAL, FORMAT, Suite

CNNSUM_PROMPTS = 2  # Prompt-IE and Prompt-IB (the paper's Sec 4)
# CNNSum's samples per subset (695 in all, the paper's Sec 3.2). The paper gives only the total; the release files'
# sizes (12.5 / 25.6 / 52.7 / 57.5 MB, github.com/CxsGhost/CNNSum at 994a7f9) over Table 1's mean lengths (15,721 /
# 31,844 / 64,303 / 128,751 Yi tokens), scaled to 695, give this split: an estimate; --cnnsum-dir counts the files.
CNNSUM_COUNTS_ESTIMATED = {"L": 193, "XL": 195, "2XL": 199, "3XL": 108}


# ---------------------------------------------------------------- the table
def _gib(v) -> str:
    return "-" if v is None else f"{v:g} GiB"


def _rate(v, unit: str = "tok/s") -> str:
    return "-" if v is None else f"{v:,.0f} {unit}"


def describe(step: Step, rec: dict) -> tuple[str, str, str, str]:
    """(result, peak GPU memory, host memory, the memory model) cells of a done or failed step."""
    r = rec.get("result") or {}
    fn = {"env": _describe_env, "prepare": _describe_prepare, "train_path": _describe_train_path,
          "train_step": _describe_train_step, "generate": _describe_generate,
          "finetune_real": _describe_finetune_real}[step.kind]
    return fn(r)


def _describe_env(r: dict) -> tuple[str, str, str, str]:
    v = r.get("versions") or {}
    fa = r.get("flash_attn") or "not found"
    sm = r.get("smoke") or {}
    smoke = (f"smoke {'ok' if sm.get('ok') else 'MISMATCH'}: loss {sm.get('plain_loss')} plain vs "
             f"{sm.get('paths_loss')} memory paths, gradient cosine {sm.get('grad_cosine')}") if sm else ""
    text = (f"{r.get('device', '-')}; torch {v.get('torch', '-')} (CUDA {r.get('cuda') or '-'}), transformers "
            f"{v.get('transformers', '-')}, peft {v.get('peft', '-')}, deepspeed {v.get('deepspeed', '-')}; "
            f"flash-attn {fa}; allocator {r.get('alloc_conf') or 'default'}; {smoke}")
    return text, _gib(r.get("gpu_gib")), _gib(r.get("host_gib")), "-"


def _describe_prepare(r: dict) -> tuple[str, str, str, str]:
    p = r.get("params")
    text = f"{p / 1e9:.2f}B parameters at {r.get('path', '-')}" if p else str(r.get("path", "-"))
    if r.get("cpu_adam"):
        text += f"; DeepSpeed CPU Adam op: {r['cpu_adam']}"
    return text, "-", "-", "-"


def _model_cell(r: dict, measured) -> str:
    est = r.get("model_estimate_gib")
    if est is None:
        return "-"
    if measured:
        return f"{est:g} GiB ({100 * (est / measured - 1):+.1f}%)"
    return f"{est:g} GiB"


def _plan_text(r: dict) -> str:
    mem = r.get("memory") or {}
    if mem.get("describe"):
        return mem["describe"]
    plan_ = r.get("memory_plan")
    if plan_:
        return f"offload {'on' if plan_.get('offload_checkpoints') else 'off'}, tile {plan_.get('tile_mlp', 0)}"
    return ""


def _describe_train_path(r: dict) -> tuple[str, str, str, str]:
    tps = r.get("tokens_per_s_steady")
    if tps:
        text = f"{_rate(tps)} ({r.get('steady_steps', 0)} steady steps)"
    elif r.get("tokens_per_s_last_step"):
        text = f"{_rate(r['tokens_per_s_last_step'])} (last step; no steady steps)"
    else:
        text = "-"
    if r.get("mfu") is not None:
        text += f", MFU {100 * r['mfu']:.1f}%"
    if _plan_text(r):
        text += f"; {_plan_text(r)}"
    att = r.get("attention") or {}
    if att.get("attn"):
        text += f"; attention {att['attn']}" + (f" ({att['sdpa_backend']})" if att.get("attn") == "sdpa" else "")
    if r.get("steps_done") is not None:
        text += f"; {r['steps_done']} step{'s' if r['steps_done'] != 1 else ''}"
    gpu = _gib(r.get("peak_gpu_gib"))
    if r.get("peak_gpu_reserved_gib"):
        gpu += f" ({r['peak_gpu_reserved_gib']:g} reserved)"
    host = f"RSS {_gib(r.get('host_peak_rss_gib'))}, machine {_gib(r.get('host_used_peak_gib'))}"
    return text, gpu, host, _model_cell(r, r.get("peak_gpu_gib"))


def _describe_train_step(r: dict) -> tuple[str, str, str, str]:
    ours, base = r.get("ours") or {}, r.get("baseline")
    text = f"ours {_rate(ours.get('tokens_per_s'))} ({ours.get('attn', '-')})"
    gpu = f"ours {_gib(ours.get('peak_mem_gib'))}"
    if base is not None:
        b = "OOM" if base.get("oom") else _rate(base.get("tokens_per_s"))
        text += f" vs plain HF Trainer + PEFT {b}"
        if base.get("tokens_per_s") and ours.get("tokens_per_s"):
            text += f" ({ours['tokens_per_s'] / base['tokens_per_s']:.2f}x)"
        gpu += f", plain {_gib(base.get('peak_mem_gib'))}"
    return text, gpu, "-", _model_cell(r, ours.get("peak_mem_gib"))


def _describe_generate(r: dict) -> tuple[str, str, str, str]:
    b, o = r.get("baseline") or {}, r.get("ours") or {}
    lo, hi = (r.get("prompt_tokens") or ["?", "?"])[:2]
    text = (f"ours {_rate(o.get('samples_per_hour'), 'samples/h')} vs plain generate "
            f"{_rate(b.get('samples_per_hour'), 'samples/h')} ({r.get('ratio', '-')}x); prompts {lo}-{hi} tokens, "
            f"{r.get('new_tokens', '-')} new")
    return text, f"ours {_gib(o.get('peak_gib'))}, plain {_gib(b.get('peak_gib'))}", "-", "-"


def _describe_finetune_real(r: dict) -> tuple[str, str, str, str]:
    t, f, z = r.get("train") or {}, r.get("finetuned") or {}, r.get("training_free") or {}

    def read(x):
        keys = ", ".join(f"{int(k) // 1024 if int(k) >= 1024 else k}{'K' if int(k) >= 1024 else ''} {v}"
                         for k, v in (x.get("passkey") or {}).items())
        return f"passkeys {keys}; loss in window {x.get('loss_in_window')}, past it {x.get('loss_past_window')}"

    text = (f"{t.get('steps')} steps, loss {t.get('first_loss')} -> {t.get('final_loss')}, "
            f"{_rate(t.get('tokens_per_s'))}; fine-tuned: {read(f)}; training-free: {read(z)}")
    return text, "-", "-", "-"


HEADER = ["step", "what", "status", "result", "peak GPU", "host", "memory model", "device", "note"]


def _status(rec: dict | None) -> str:
    status = (rec or {}).get("status", "pending")
    return "simulated" if status == "failed" and rec.get("simulated") else status


def rows(steps: list[Step], suite: Suite) -> list[list[str]]:
    out = []
    for s in steps:
        rec = suite.steps.get(s.name)
        status = _status(rec)
        cells = ("-", "-", "-", "-")
        note = (rec or {}).get("note", "")
        if status == "done" or (status == "failed" and s.kind == "train_path" and (rec.get("result") or {})
                                .get("steps_done")):
            cells = describe(s, rec)
        if status == "simulated":
            note = (f"{note}: simulated out of memory, nothing ran (the longer lengths of its group are skipped as "
                    "after a real one)")
        elif status == "failed":
            note = "; ".join(x for x in (note, ("OUT OF MEMORY: " if (rec.get("result") or {}).get("oom") else "")
                                         + rec.get("error", "")) if x)
        elif status == "skipped":
            note = rec.get("why", "")
        elif status == "running":
            note = "cut off (runs again next time)"
        title = s.title + (f" (dry run: {s.run_tokens} tokens)" if suite.data.get("dry_run") and s.run_tokens
                           else "")
        row = [s.name, title, status, *cells, (rec or {}).get("device", "-"), note]
        out.append([str(c).replace("|", "/") for c in row])
    return out


def fit_check(suite: Suite) -> dict | None:
    """The cut models' peaks against the memory model's: per-layer slope (peak(4) - peak(2)) / 2 and constant
    peak(2) - 2 x slope, measured and modelled, with the relative errors."""
    res = {}
    for n in FIT_LAYERS:
        rec = suite.steps.get(f"fit-{n}l") or {}
        r = rec.get("result") or {}
        if rec.get("status") != "done" or r.get("peak_gpu_gib") is None or r.get("model_estimate_gib") is None:
            return None
        res[n] = (r["peak_gpu_gib"], r["model_estimate_gib"])
    (m2, e2), (m4, e4) = res[FIT_LAYERS[0]], res[FIT_LAYERS[1]]
    span = FIT_LAYERS[1] - FIT_LAYERS[0]
    slope, slope_model = (m4 - m2) / span, (e4 - e2) / span
    const, const_model = m2 - FIT_LAYERS[0] * slope, e2 - FIT_LAYERS[0] * slope_model
    err = lambda model, meas: round(model / meas - 1, 4) if meas else None  # noqa: E731
    return {"slope_gib": round(slope, 3), "slope_model_gib": round(slope_model, 3),
            "slope_error": err(slope_model, slope), "constant_gib": round(const, 3),
            "constant_model_gib": round(const_model, 3), "constant_error": err(const_model, const)}


def cnnsum_counts(cnnsum_dir: str | None) -> tuple[dict, str]:
    """(samples per subset, where they come from): the release files of ``cnnsum_dir`` counted, else the
    estimate :data:`CNNSUM_COUNTS_ESTIMATED`."""
    from ropescale.common.io import InputError
    from ropescale.common.subsets import SUBSETS

    if not cnnsum_dir:
        return dict(CNNSUM_COUNTS_ESTIMATED), "estimated split of the 695 samples (see bench/gpu_suite.py)"
    counts = {}
    for name in GEN_SUBSETS:
        f = Path(cnnsum_dir) / f"{SUBSETS[name].release_file}.jsonl"
        if not f.is_file():
            raise InputError(f"{f}: no such file (--cnnsum-dir holds the release's cnnsum_*.jsonl files)")
        with open(f, encoding="utf-8") as fh:
            counts[name] = sum(1 for line in fh if line.strip())
    return counts, f"counted in {cnnsum_dir}"


def cnnsum_hours(steps: list[Step], suite: Suite, counts: dict) -> list[dict]:
    """Per generation shape and side: hours per subset for its samples x 2 prompts, and the total where every
    subset ran."""
    out = []
    for prefix in dict.fromkeys(s.group for s in steps if s.kind == "generate"):
        gen = [s for s in steps if s.group == prefix]
        for side in ("ours", "baseline"):
            per = {}
            for s in gen:
                rec = suite.steps.get(s.name) or {}
                res = rec.get("result") or {}
                sph = (res.get(side) or {}).get("samples_per_hour") if rec.get("status") == "done" else None
                sub = s.info["subset"]
                per[sub] = float(f"{counts[sub] * CNNSUM_PROMPTS / sph:.3g}") if sph else (
                    "OOM" if res.get("oom") else None)
            total = float(f"{sum(per.values()):.3g}") if all(isinstance(v, float) for v in per.values()) else None
            out.append({"shape": gen[0].info["shape"], "side": "eval_summ hf backend" if side == "ours" else
                        "plain generate", "hours": per, "total_hours": total})
    return out


def fa2_line(suite: Suite) -> str | None:
    fa, sd = (suite.steps.get(n) or {} for n in ("fa2-16k", "nozero-16k"))
    a = ((fa.get("result") or {}).get("ours") or {}).get("tokens_per_s")
    b = ((sd.get("result") or {}).get("ours") or {}).get("tokens_per_s")
    if fa.get("status") == "done" and sd.get("status") == "done" and a and b:
        return f"FlashAttention-2 vs SDPA at 16K (no-ZeRO path): {a:,.0f} vs {b:,.0f} tok/s ({a / b:.2f}x)"
    return None


def report(steps: list[Step], suite: Suite, counts: tuple[dict, str]) -> dict:
    st = [_status(suite.steps.get(s.name)) for s in steps]
    return {"format": FORMAT, "workdir": str(suite.dir), "dry_run": bool(suite.data.get("dry_run")),
            "complete": all(x in FINAL or x in ("skipped", "simulated") for x in st),
            "counts": {k: st.count(k) for k in ("done", "failed", "simulated", "skipped", "running", "pending")},
            "fit_check": fit_check(suite),
            "header": HEADER, "rows": rows(steps, suite), "cnnsum": {"samples": counts[0], "source": counts[1],
                                                                     "prompts": CNNSUM_PROMPTS,
                                                                     "estimates": cnnsum_hours(steps, suite,
                                                                                               counts[0])},
            "fa2_vs_sdpa": fa2_line(suite), "steps": {s.name: suite.steps.get(s.name) for s in steps}}


def markdown(rep: dict) -> str:
    from ropescale.common.tables import markdown as md_table

    c = rep["counts"]
    head = (f"GPU suite{' (DRY RUN: CPU, toy shapes: no figure here is a GPU figure)' if rep['dry_run'] else ''}: "
            f"{rep['workdir']} — {c['done']} done, {c['failed']} failed, "
            + (f"{c['simulated']} simulated (stand-ins that ran nothing), " if c.get("simulated") else "")
            + f"{c['skipped']} skipped, {c['pending'] + c['running']} to run" + (" — complete" if rep["complete"]
                                                                                  else ""))
    parts = [head, "", md_table(rep["header"], rep["rows"])]
    est = rep["cnnsum"]["estimates"]
    if any(e["total_hours"] or any(isinstance(v, float) for v in e["hours"].values()) for e in est):
        s = rep["cnnsum"]["samples"]
        hdr = ["shape", "generator", *(f"{k} ({s[k]} x {rep['cnnsum']['prompts']})" for k in GEN_SUBSETS),
               "all of CNNSum"]
        cell = lambda v: "-" if v is None else v if isinstance(v, str) else f"{v:g} h"  # noqa: E731
        parts += ["", f"Estimated wall time of all of CNNSum x {rep['cnnsum']['prompts']} prompts (samples: "
                  f"{rep['cnnsum']['source']}):", "",
                  md_table(hdr, [[e["shape"], e["side"], *(cell(e["hours"].get(k)) for k in GEN_SUBSETS),
                                  cell(e["total_hours"])] for e in est])]
    if rep.get("fa2_vs_sdpa"):
        parts += ["", rep["fa2_vs_sdpa"]]
    f = rep.get("fit_check")
    if f:
        pct = lambda x: "-" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
        parts += ["", f"Memory model per decoder layer (the cut models' peaks): slope {f['slope_gib']} GiB measured vs "
                  f"{f['slope_model_gib']} modelled ({pct(f['slope_error'])}), constant {f['constant_gib']} vs "
                  f"{f['constant_model_gib']} GiB ({pct(f['constant_error'])})"]
    return "\n".join(parts)


