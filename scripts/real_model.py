"""The real-model table: every RoPE method, training-free, on SmolLM2-135M (``make real-model``), read by passkey
retrieval and by the loss at every position of held-out Austen windows; writes docs/real_model.md.

    .venv/bin/python scripts/real_model.py                   # the table (3 windows of 16,384 tokens, x2)
    .venv/bin/python scripts/real_model.py --quick           # seconds: what a test runs (under runs/real_model-quick/)

Each window (``ropescale.probes.passkey``) is 16,384 tokens of a novel a fine-tune to compare would not train
on (Emma, Persuasion, Northanger Abbey: one window each) with 9 named passkeys planted, 3 per length (4,096,
8,192 and 16,384 tokens, at 15 / 45 / 75 % of the length), each length's questions and teacher-forced answers
ending at that length. Every row is one setting at x2 of the 8,192-token window. One forward of 16,384 tokens a
window and row gives the loss at every position and the keys of every length; a rope that follows the length
(dynamic NTK, dynamic YaRN, LongRoPE) is run again at 4,096 and 8,192 tokens, except where its frequencies at that
length are those of a forward already run on the window (dynamic NTK and dynamic YaRN within the window are plain
RoPE, dynamic YaRN at 16,384 is YaRN x2: ``formulas.frequencies`` decides, pair by pair). Results are appended to
``docs/real_model/results.jsonl`` (``--work``) as each (window, row) finishes: a re-run resumes (``--windows N``
extends a run: window i is the same whatever N), and the page is written from what is there.

The last two rows are the attention-level methods on the model's own RoPE (``--attention-extend``; settings:
:func:`attention_rows`), read the same way. Cost (fp32, 2 cores, no other load): a 16,384-token forward ~113 s, so 8
of them plus LongRoPE's two shorter ones, ~16 min a window: 3 windows ~50 min; Self-Extend and DCA pay about twice a
plain forward each (their attention passes). x4 (32,768 tokens) does not fit: a forward there would take ~6 min
(113 s x ~3.1 per doubling, as from 8K to 16K), ~2.5 h for the same rows.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_scaling import RopeSpec  # noqa: E402
from rope_scaling.formulas import PLAIN, REGISTRY, rescale_factors  # noqa: E402
from rope_scaling.search import factors_of  # noqa: E402
from ropescale.common.io import write_text_atomic  # noqa: E402
from ropescale.common.paths import DATA_DIR  # noqa: E402
from ropescale.common.stats.lengths import effective_length  # noqa: E402
from ropescale.common.stats.means import cell, t_interval  # noqa: E402
from ropescale.common.stats.proportions import wilson  # noqa: E402
from ropescale.probes import passkey as pk  # noqa: E402

MODEL = ROOT / "models" / "smollm2-135m"
AUSTEN = DATA_DIR / "english" / "austen"
HELDOUT = ("emma", "persuasion", "northangerabbey")  # a fine-tune to compare trains on the other three
ABF_BASE = 1e6  # ABF's new base: 10x SmolLM2's 1e5 (Code Llama went 1e4 -> 1e6 for x4)
PASS = 0.5  # the passkey effective length: the longest length with accuracy >= this
GUESS = math.log(10)  # ... by answer loss: the longest length whose mean loss per digit beats a uniform guess
MARGIN = 0.25  # the loss effective length: the longest bucket within this many nats of the in-window loss (one
# window's in-window 1K buckets spread by about +-0.2 around their mean: a smaller margin reads the text, not length)
QUICK_DIR = ROOT / "runs" / "real_model-quick"  # a --quick run's default page and results: never docs/
READING = "<!-- reading: scripts/real_model.py keeps what follows this line -->"


@dataclasses.dataclass(frozen=True)
class Plan:
    windows: int = 3
    lengths: tuple = (4096, 8192, 16384)
    depths: tuple = (0.15, 0.45, 0.75)
    orig: int = 8192  # the model's window (the specs' original context)
    scale: float = 2.0
    bucket: int = 1024
    seed: int = 0

    @property
    def total(self) -> int:
        return max(self.lengths)

    def key(self) -> str:
        """The plan's identity without ``windows``: window i is the same whatever the count (a run extends)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "windows"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


QUICK = Plan(windows=2, lengths=(256, 512), depths=(0.25, 0.75), orig=256, bucket=128)


def specs(plan: Plan, state) -> dict[str, RopeSpec]:
    """The rows: every method of the registry at x``scale`` (ABF: a new base; LongRoPE: YaRN's per-pair factors as
    its long factors, short factors 1)."""
    s, o = plan.scale, plan.orig
    yarn = RopeSpec("yarn", s, orig_ctx=o)
    lr = factors_of(rescale_factors(yarn, state.rotary_dim, state.base))
    return {PLAIN: RopeSpec(), "yarn": yarn, "dynamic_yarn": RopeSpec("dynamic_yarn", s, orig_ctx=o),
            "pi": RopeSpec("pi", s, orig_ctx=o), "ntk": RopeSpec("ntk", s, orig_ctx=o),
            "dynamic_ntk": RopeSpec("dynamic_ntk", s, orig_ctx=o), "llama3": RopeSpec("llama3", s, orig_ctx=o),
            "longrope (YaRN's factors)": RopeSpec("longrope", s, orig_ctx=o, longrope_factors=lr),
            f"abf (base {ABF_BASE:.0e})": RopeSpec("abf", rope_base=ABF_BASE, orig_ctx=o), **attention_rows(plan)}


def attention_rows(plan: Plan) -> dict[str, RopeSpec]:
    """Self-Extend and DCA on the plain RoPE for orig -> orig x scale. Self-Extend: W = orig / 4 (inside the authors'
    neighbour range, 1/8-3/8 of the window) and the smallest power-of-two G dividing W whose reach (orig - W) G + W
    covers the length (datamllab/LongLM README Sec 4: the smallest group that covers it first); 8K -> 16K: G = 4,
    W = 2,048 (G = 2 never covers 2x: (L - W) 2 + W < 2L). DCA: the authors' sizes (C = 3/4, L = 1/8 of orig)."""
    o, total = plan.orig, plan.total
    w = o // 4
    g = next(g for g in (2 ** k for k in range(1, 20)) if w % g == 0 and (o - w) * g + w >= total)
    se = RopeSpec(attention_extend="self_extend", grp_attn_n=g, grp_attn_w=w, orig_ctx=o)
    dca = RopeSpec(attention_extend="dca", dca_chunk_size=o * 3 // 4, dca_local_size=o // 8, orig_ctx=o)
    return {se.label(): se, dca.label(): dca}


def signature(state, seq_len: int | None) -> tuple:
    """What a forward computes with this rope at ``seq_len``: the frequencies and attention factor, rounded."""
    f = state.frequencies(seq_len)
    return tuple(float(f"{x:.10e}") for x in f.inv_freq) + (round(f.attention_factor, 10),)


# ---------------------------------------------------------------- running
def read_row(model_dir: Path, name: str, spec: RopeSpec, w: pk.Window, cache: dict, plan: Plan) -> dict:
    """One row on one window: the forwards it needs (reused from ``cache`` where the frequencies match), its keys,
    its loss by bucket and its in-window loss by bucket."""
    import torch

    from rope_scaling.load import load_config, load_model

    mc = load_config(model_dir, spec)
    st = mc.state
    by_length = REGISTRY[st.spec.method].by_length
    need = sorted(plan.lengths) if by_length else [plan.total]
    got, log, model = {}, {}, None
    for L in need:
        sig = signature(st, L if by_length else None) + (spec.attention_label(),)  # an attention method: its own
        hit = cache.get((sig, "all")) or cache.get((sig, L))
        if hit is None:
            model = model or load_model(model_dir, mc.config, dtype=torch.float32, attn="sdpa", state=st).eval()
            t = time.monotonic()
            nll, arg = pk.forward_read(model, w.ids[:L])
            hit = (nll, arg, name)
            cache[(sig, L if by_length else "all")] = hit
            log[L] = {"seconds": round(time.monotonic() - t, 1)}
        else:
            log[L] = {"reused": hit[2]}
        got[L] = hit
    at = (lambda L: got[L]) if by_length else (lambda L: got[plan.total])
    keys = [r for L in sorted(plan.lengths) for r in pk.key_results(w, at(L)[1], at(L)[0], L)]
    return {"keys": keys, "buckets": pk.bucket_losses(w, at(plan.total)[0], plan.total, plan.bucket),
            "inwin_buckets": pk.bucket_losses(w, at(plan.orig)[0], plan.orig, plan.bucket), "forwards": log}


def windows(plan: Plan, tokenizer) -> list[pk.Window]:
    texts = {n: (AUSTEN / f"{n}.txt").read_text(encoding="utf-8") for n in HELDOUT}
    return pk.novel_windows(tokenizer, texts, plan.windows, plan.lengths, plan.depths, plan.seed)


def done_rows(results: Path, key: str) -> set:
    if not results.is_file():
        return set()
    rows = [json.loads(ln) for ln in results.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return {(r["window"], r["row"]) for r in rows if r["plan"] == key}


def run(plan: Plan, work: Path, model_dir: Path = MODEL) -> None:
    """Every (window, row) not yet in ``work/results.jsonl``, window by window."""
    from transformers import AutoTokenizer

    work.mkdir(parents=True, exist_ok=True)
    results = work / "results.jsonl"
    done = done_rows(results, plan.key())
    rows = specs(plan, _state(model_dir))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    for i, w in enumerate(windows(plan, tok)):
        cache: dict = {}
        for name, spec in rows.items():
            if (i, name) in done:
                continue
            t = time.monotonic()
            r = read_row(model_dir, name, spec, w, cache, plan)
            rec = {"plan": plan.key(), "window": i, "row": name, "spec": spec.label(), "source": w.source,
                   "start": w.start, "seconds": round(time.monotonic() - t, 1), "load": os.getloadavg()[0], **r}
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"[real_model] window {i} ({w.source}) {name}: {rec['seconds']} s, passkeys "
                  f"{sum(k['retrieved'] for k in r['keys'])}/{len(r['keys'])}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the page
def kilo(n: int) -> str:
    return f"{n // 1024}K" if n and n % 1024 == 0 else str(n)


def load_results(work: Path, plan: Plan) -> dict[str, list[dict]]:
    by_row: dict[str, list[dict]] = {}
    for ln in (work / "results.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(ln) if ln.strip() else None
        if r and r["plan"] == plan.key():
            by_row.setdefault(r["row"], []).append(r)
    return by_row


def inwin(r: dict) -> float:
    """A window's in-window loss: the mean of its in-window buckets after the first (>= 1 bucket of context)."""
    v = [x for x in r["inwin_buckets"][1:] if not math.isnan(x)]
    return sum(v) / len(v)


def pct(flags: list[bool]) -> str:
    """A passkey cell: % of keys retrieved, its Wilson 95 % interval (never [0, 0] for 0 of n), n keys."""
    if not flags:
        return "-"
    w = wilson(sum(flags), len(flags))
    return f"{100 * w.rate:.0f} [{100 * w.lo:.0f}, {100 * w.hi:.0f}] (n={w.n})"


LOSS = (0.0, math.inf)  # a loss's range: its interval is clipped to it (the floor's rule)


def t_cell(values: list[float], digits: int = 2, spread: bool = True, bounds=None) -> str:
    """A mean over few units (windows): the 95 % t interval (the floor's; ``bounds``: clipped to the score's range),
    and (``spread``) the units' range."""
    e = t_interval([x for x in values if not math.isnan(x)], bounds=bounds)
    if e.mean is None:
        return "-"
    if e.lo is None:
        return f"{e.mean:.{digits}f} (n=1)"
    rng = f" (range {e.spread[0]:.{digits}f}-{e.spread[1]:.{digits}f})" if spread else ""
    return f"{e.mean:.{digits}f} [{e.lo:.{digits}f}, {e.hi:.{digits}f}]{rng}"


def cost_text(r: dict) -> str:
    """A row's in-window cost over windows; the unscaled row is the reference (0 by construction)."""
    return "0 (the reference)" if r["row"] == PLAIN else t_cell(r["inwin_cost"], 3)


def copier_loss(keys_in_input: int, digits: int = 5) -> float:
    """Nats a digit paid by a model that copies one of the K keys in its input at random, ignoring the name: ln K /
    digits (the first digit picks the key, the rest follow it)."""
    return math.log(keys_in_input) / digits


def by_distance(by_row: dict, plan: Plan) -> str:
    """Table D: the answer loss of each (length, depth) key, mean over windows, by its distance to the question,
    with the references a reading needs: a uniform guess (ln 10) and a copier of one of the K keys in the input."""
    slots = sorted({(k["length"], k["depth"]) for recs in by_row.values() for r in recs for k in r["keys"]})
    if not slots:
        return ""
    some = next(iter(by_row.values()))
    dist = {s: [k["distance"] for r in some for k in r["keys"] if (k["length"], k["depth"]) == s] for s in slots}
    k_in = {L: sum(1 for (L2, _d) in slots if L2 <= L) for L in plan.lengths}
    head = ["| row | " + " | ".join(f"{kilo(L)}, key {sum(dist[(L, d)]) / len(dist[(L, d)]):,.0f} back"
                                     for (L, d) in slots) + " |", "|" + "---|" * (len(slots) + 1)]
    refs = ("| *references* | " + " | ".join(f"guess {math.log(10):.2f}; copier of {k_in[L]}: "
                                             f"{copier_loss(k_in[L]):.2f}" for (L, d) in slots) + " |")
    rows = [f"| {name} | " + " | ".join(t_cell([sum(k["answer_loss"] for k in r["keys"] if (k["length"],
                                                k["depth"]) == s) for r in recs], bounds=LOSS) for s in slots) + " |"
            for name, recs in by_row.items()]
    return ("\n### D. Answer loss by key distance (nats per digit; mean over windows [95 % t interval over windows] "
            "(range of the windows))\n\n" + "\n".join(head + [refs] + rows) + "\n")


def summarize(by_row: dict, plan: Plan, model_dir: Path) -> list[dict]:
    """One dict per row: bound, passkey cells, answer loss cells, loss by bucket, in-window cost, effective
    lengths."""
    from rope_scaling.describe import describe, load_config

    cfg = load_config(model_dir)
    base = {r["window"]: inwin(r) for r in by_row.get(PLAIN, [])}
    ref = sum(base.values()) / len(base) if base else None
    cols = [kilo(L) for L in sorted(plan.lengths)]
    out = []
    state_specs = specs(plan, _state(model_dir))
    for name, recs in by_row.items():
        spec = state_specs[name]
        keys = [k for r in recs for k in r["keys"]]
        acc = {kilo(L): [bool(k["retrieved"]) for k in keys if k["length"] == L] for L in plan.lengths}
        ans = {kilo(L): cell([k["answer_loss"] for k in keys if k["length"] == L], bounds=LOSS)
               for L in plan.lengths}
        nb = plan.total // plan.bucket
        bucket_values = [[r["buckets"][b] for r in recs if not math.isnan(r["buckets"][b])] for b in range(nb)]
        buckets = [cell(v, bounds=LOSS) for v in bucket_values]  # the means the effective length reads
        cost = [inwin(r) - base[r["window"]] for r in recs if r["window"] in base]
        d = describe(cfg, spec, seq_len=plan.total)
        bound = d["attention_extend"]["max_context"] if "attention_extend" in d else d["reach"]
        eff_pk = effective_length({c: sum(acc[c]) / len(acc[c]) if acc[c] else None for c in cols}, PASS,
                                  columns=cols)
        eff_ans = effective_length({c: -ans[c].mean for c in cols}, -GUESS, columns=cols)
        bcols = [kilo((b + 1) * plan.bucket) for b in range(1, nb)]
        eff_loss = effective_length({c: -buckets[b + 1].mean for b, c in enumerate(bcols)},
                                    None if ref is None else -(ref + MARGIN), columns=bcols)
        out.append({"row": name, "spec": spec.label(), "windows": len(recs), "bound": bound, "passkey": acc,
                    "answer_loss": ans, "buckets": buckets, "bucket_values": bucket_values,
                    "inwin_cost": cost, "eff_passkey": eff_pk.text(),
                    "eff_answer": eff_ans.text(), "eff_loss": eff_loss.text(), "inwin": cell([inwin(r) for r in recs]),
                    "seconds": sum(r["seconds"] for r in recs)})
    return out


def _state(model_dir: Path):
    from rope_scaling.load import load_config

    return load_config(model_dir).state


def tables(rows: list[dict], plan: Plan, ref: float | None) -> str:
    cols = [kilo(L) for L in sorted(plan.lengths)]
    bound = lambda b: "none" if b is None else f"{b:,.0f}"  # noqa: E731
    a = ["| row | bound | " + " | ".join(f"passkey {c}" for c in cols) + " | eff. length (passkey >= "
         f"{PASS:.0%}) | eff. length (answer loss < ln 10) | eff. length (loss <= in-window + {MARGIN}) | "
         "in-window cost (nats) |", "|" + "---|" * (len(cols) + 6)]
    for r in rows:
        a.append(f"| {r['row']} | {bound(r['bound'])} | " + " | ".join(pct(r["passkey"][c]) for c in cols)
                 + f" | {r['eff_passkey']} | {r['eff_answer']} | {r['eff_loss']} | {cost_text(r)} |")
    b = ["| row | " + " | ".join(f"answer loss {c}" for c in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        b.append(f"| {r['row']} | " + " | ".join(r["answer_loss"][c].text(2) + f" (n={r['answer_loss'][c].n})"
                                                for c in cols) + " |")
    nb = plan.total // plan.bucket
    c = ["| positions | " + " | ".join(r["row"] for r in rows) + " |", "|" + "---|" * (len(rows) + 1)]
    for i in range(nb):
        lab = f"{kilo(i * plan.bucket)}-{kilo((i + 1) * plan.bucket)}"
        mark = " (past the window)" if i * plan.bucket >= plan.orig else ""
        c.append(f"| {lab}{mark} | " + " | ".join(t_cell(r["bucket_values"][i], spread=False, bounds=LOSS)
                                                  for r in rows) + " |")
    refs = "-" if ref is None else f"{ref:.3f}"
    return ("### A. Passkey retrieval (% of keys; [95 % Wilson interval], n keys) and the effective lengths\n\n"
            + "\n".join(a) + f"\n\nIn-window loss of the unscaled model (positions {kilo(plan.bucket)}-"
            f"{kilo(plan.orig)}, mean over windows): {refs} nats/token; a row's in-window cost is its own minus that, "
            "window by window (95 % t interval over windows, and the windows' range).\n\n"
            "### B. Answer loss (nats per answer digit, teacher-forced; mean [95 % t interval over keys: the keys of "
            "one window are not independent, so it is too narrow], n keys)\n\n"
            + "\n".join(b) + "\n\n### C. Loss by position (nats/token over the novel's own tokens; mean over windows "
            "[95 % t interval over windows])\n\n" + "\n".join(c) + "\n")


def header(plan: Plan, argv: list[str], rows: list[dict], meta: dict, n_rows: int, results: str) -> str:
    n = max((r["windows"] for r in rows), default=0)
    cmd = "scripts/real_model.py" + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))
    mins = sum(r["seconds"] for r in rows) / 60
    done, planned = sum(r["windows"] for r in rows), plan.windows * n_rows
    state = "" if done >= planned else (f" **Partial: {done} of the {planned} (window, row) cells planned are "
                                        "measured; the same command resumes and completes the page.**")
    return (f"# The real-model table: SmolLM2-135M, every RoPE method at x{plan.scale:g}, training-free\n\n"
            f"Made by `.venv/bin/python {cmd}` ({n} windows of {plan.total:,} tokens; windows, keys and rows: the "
            f"script's docstring). Wall time {mins:.0f} min in all (the rows' forwards and loads, summed over "
            f"runs), on {meta['machine']}; load average {meta['load']}; each row's load average when it finished: "
            f"the load field of {results} (one record a window and row). {meta['versions']}.{state}\n\n")


def machine() -> dict:
    import torch
    import transformers

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo", encoding="utf-8")
                if ln.startswith("model name")), platform.machine())
    return {"machine": f"{cpu}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads, fp32",
            "load": " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min, when the page was written)",
            "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}


def write_page(out: Path, plan: Plan, work: Path, argv: list[str], model_dir: Path = MODEL,
               page_only: bool = False) -> list[dict]:
    """The page from the results in ``work``; a --page-only re-render keeps the measurement's header (the command,
    machine and load that made the numbers) and says when the page was re-rendered."""
    by_row = load_results(work, plan)
    rows = summarize(by_row, plan, model_dir)
    order = list(specs(plan, _state(model_dir)))
    rows.sort(key=lambda r: order.index(r["row"]))
    base = [inwin(r) for r in by_row.get(PLAIN, [])]
    ref = sum(base) / len(base) if base else None
    res = work / "results.jsonl"
    res = res.relative_to(ROOT) if res.resolve().is_relative_to(ROOT) else res
    ordered = {name: by_row[name] for name in order if name in by_row}
    old = out.read_text(encoding="utf-8") if out.is_file() else ""
    head = header(plan, argv, rows, machine(), len(order), str(res))
    if page_only and old.startswith("# ") and "\n\n### A." in old:
        made = old.split("\n\n### A.", 1)[0].split(" (re-rendered by")[0].rstrip(".\n")
        head = made + f". (re-rendered by `scripts/real_model.py --page-only` on {time.strftime('%Y-%m-%d')})\n\n"
    text = head + tables(rows, plan, ref) + by_distance(ordered, plan)
    kept = old.split(READING, 1) if old else []
    text += "\n" + READING + (kept[1] if len(kept) == 2 else "\n")
    write_text_atomic(out, text)
    return rows


def outputs(quick: bool, out: str | None, work: str | None) -> tuple[Path, Path]:
    """The page and the results directory: docs/ for the measurement; a --quick run writes under runs/ unless told
    where (it never appends toy records to the committed results a full run resumes from)."""
    home = QUICK_DIR if quick else ROOT / "docs" / "real_model"
    return Path(out) if out else (home / "real_model.md" if quick else ROOT / "docs" / "real_model.md"), \
        Path(work) if work else home


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(allow_abbrev=False, prog="scripts/real_model.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 windows of 512 tokens, the specs' original context 256 "
                                                        "(seconds: the code path, not a measurement)")
    p.add_argument("--windows", type=int, help="windows (default 3; --quick 2)")
    p.add_argument("--out", help="the page to write (default docs/real_model.md; --quick: "
                                 "runs/real_model-quick/real_model.md, never a committed page)")
    p.add_argument("--work", help="where results.jsonl is kept (default docs/real_model, beside the page, committed "
                                  "with it; --quick: runs/real_model-quick; resumable)")
    p.add_argument("--model", default=str(MODEL), help="the model directory (make real-model writes it)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 is faster on cores other "
                                                "processes share)")
    p.add_argument("--page-only", action="store_true", help="write the page from the results there, run nothing")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args(argv)
    plan = QUICK if a.quick else Plan()
    if a.windows:
        plan = dataclasses.replace(plan, windows=a.windows)
    out, work = outputs(a.quick, a.out, a.work)
    model_dir = Path(a.model)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    if not (model_dir / "config.json").is_file():
        print(f"error: {model_dir}: no model directory (make real-model writes it)", file=sys.stderr)
        return 2
    if not a.page_only:
        run(plan, work, model_dir)
    rows = write_page(out, plan, work, argv, model_dir, page_only=a.page_only)
    if a.json:
        skip = ("passkey", "answer_loss", "buckets", "bucket_values")
        print(json.dumps([{k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in r.items() if k not in skip}
                          for r in rows], default=str))
    else:
        print(f"[real_model] wrote {out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
