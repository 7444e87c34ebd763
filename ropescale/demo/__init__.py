"""The end-to-end demo (``make demo``; ``scripts/demo.py`` is its command line and its help describes the six steps):
extend the tiny default's context with each RoPE method, with and without fine-tuning, and evaluate extrapolation
the CNNSum way, on a CPU in minutes. :func:`run_demo` runs the steps in order.

- ``steps``: steps 1-5 (model, data, fine-tunes, generation, report), the :class:`Demo` they fill in and its
  :class:`Row` settings, and what the scripts built on the demo share (``scripts/table2_tiny.py``, ``bound_tiny.py``,
  ``positions_tiny.py``, ``probe_tables.py``);
- ``rows``: one row of the demo's tables (bound, losses, cells, its JSON record);
- ``tables``: step 6, the demo's own tables A-C.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from rope_scaling.formulas import METHODS as USER_METHODS
from ropescale.common.io import InputError

from .rows import LAST, LEARNED, row_bound, row_stats, table_row, train_losses
from .steps import (
    F1,
    F2,
    FREE,
    METHODS,
    T0,
    Demo,
    Row,
    fine_tunes,
    finetune_command,
    generate_once,
    generate_run,
    generation,
    in_process,
    over_seeds,
    rel,
    reports,
    say,
    scaled,
    sh,
    tagged,
    the_data,
    the_model,
)
from .tables import cell_text, comparison_pairs, demo_table, diff_text, mse_text, sample_means

__all__ = ["F1", "F2", "FREE", "LAST", "LEARNED", "METHODS", "T0", "Demo", "Row", "cell_text", "comparison_pairs",
           "demo_table", "diff_text", "fine_tunes", "finetune_command", "generate_once", "generate_run", "generation",
           "in_process", "mse_text", "over_seeds", "reports", "row_bound", "row_stats", "run_demo", "sample_means",
           "scaled", "sh", "table_row", "tagged", "the_data", "the_model", "train_losses"]


def run_demo(out: str = "runs/demo", *, model: str = "tiny", methods=METHODS, free=FREE, scale: float = 8,
             factors=(1, 2, 4, 8), samples: int = 16, max_new_tokens: int = 128, train_lo: float = 2,
             train_hi: float = 4, pairs: int = 256, launcher: str = "deepspeed", finetune_args=(), seed: int = 0,
             chapters: str | None = None, heldout: int | None = None, baseline_prompts: bool = True,
             fresh: bool = False) -> dict:
    """The demo's six steps (``scripts/demo.py --help``), in order; returns where everything went and the demo
    table's rows. InputError for a method the registry does not have (before anything runs)."""
    from ropescale.common.paths import CHAPTERS_JSONL

    unknown = [m for m in (*methods, *free) if m not in USER_METHODS]
    if unknown:
        raise InputError(f"--methods / --free: unknown RoPE method {unknown[0]!r} (one of {', '.join(USER_METHODS)})")

    d = Demo(Path(out), model, tuple(methods), tuple(free), scale, tuple(factors), samples, max_new_tokens, train_lo,
             train_hi, pairs, launcher, tuple(finetune_args), seed, str(chapters or CHAPTERS_JSONL), heldout,
             baseline_prompts)
    if fresh and d.out.exists():
        say(f"--fresh: removing {rel(d.out)}")
        shutil.rmtree(d.out)
    d.out.mkdir(parents=True, exist_ok=True)
    the_model(d)
    the_data(d)
    fine_tunes(d)
    generation(d)
    t = time.time()
    reports(d)
    records = demo_table(d)
    d.times["report"] = time.time() - t
    print()
    say(f"all tables in {rel(d.report)}/ (demo.md: the table above), Fig. 3 in {rel(d.fig)}")
    say("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in d.times.items()))
    say(f"demo finished in {time.time() - T0:.0f}s")
    return {"model_dir": str(d.model_dir), "packed": str(d.packed),
            "merged": {m: str(p) for m, p in d.merged.items()}, "evals": {tg: str(p) for tg, p in d.evals.items()},
            "gen": str(d.gen), "gen_f1": str(d.gen_f1), "report": str(d.report), "fig": str(d.fig),
            "rows": [r.key for r in d.rows], "table": records, "times": d.times}
