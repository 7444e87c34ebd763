"""The end-to-end demo (``make demo``; ``python -m ropescale.demo`` is its command line, ``scripts/demo.py`` calls it,
and its help describes the six steps): extend the tiny default's context with each RoPE method, with and without
fine-tuning, and evaluate extrapolation the CNNSum way, on a CPU in minutes. :func:`run_demo` runs the steps in
order with a :class:`DemoSettings`.

- ``cli``: the command line (the settings' flags and ``--recipe``; the help);
- ``steps``: steps 1-5 (model, data, fine-tunes, generation, report), the demo's settings (:class:`DemoSettings`),
  the :class:`Demo` they fill in and its :class:`Row` settings, and what the scripts built on the demo share;
- ``rows``: one row of the demo's tables (bound, losses, cells, its JSON record);
- ``tables``: step 6, the demo's own tables A-C.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from rope_scaling.formulas import METHODS as USER_METHODS
from ropescale.common.io import InputError
from ropescale.common.settings import check, make, spec_by_key

from .rows import LAST, LEARNED, row_bound, row_stats, table_row, train_losses
from .steps import (
    F1,
    F2,
    FREE,
    METHODS,
    T0,
    Demo,
    DemoSettings,
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

__all__ = ["F1", "F2", "FREE", "LAST", "LEARNED", "METHODS", "T0", "Demo", "DemoSettings", "Row", "cell_text",
           "comparison_pairs", "demo_table", "diff_text", "fine_tunes", "finetune_command", "generate_once",
           "generate_run", "generation", "in_process", "mse_text", "over_seeds", "reports", "row_bound",
           "row_stats", "run_demo", "sample_means", "scaled", "sh", "table_row", "tagged", "the_data",
           "the_model", "train_losses"]


def run_demo(settings: DemoSettings | None = None, **kw) -> dict:
    """The demo's six steps (``python -m ropescale.demo --help``), in order, with ``settings`` (a
    :class:`DemoSettings`; ``kw``: settings by name over it or the defaults, e.g. ``run_demo(out=DIR, samples=2)``,
    each read as its flag's value is);
    returns where everything went and the demo table's rows. InputError for a value a flag would refuse or a method
    the registry does not have (before anything runs)."""
    by_key = spec_by_key(DemoSettings)
    for k in set(kw) & set(by_key):  # read as its flag's value is (a tuple as a list, 8 as 8.0)
        try:
            kw[k] = by_key[k].convert(str(kw[k]) if isinstance(kw[k], Path) else kw[k])
        except ValueError as e:
            raise InputError(f"{by_key[k].flag}: {e}") from None
    st = make(DemoSettings, settings, **kw)
    check(st)
    unknown = [m for m in (*st.methods, *st.free) if m not in USER_METHODS]
    if unknown:
        raise InputError(f"--methods / --free: unknown RoPE method {unknown[0]!r} (one of {', '.join(USER_METHODS)})")

    d = Demo.of(st)
    if d.fresh and d.out.exists():
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
