"""Training curves: where a fine-tune's loss and learning rate go besides its log.

- Always: ``RUN/train_curves.png`` at the end of training (``trainer.ProgressCallback``), redrawn by ``finetune.py
  plot RUN`` (also for a run that was stopped): the loss and the learning rate of each logged optimizer step,
  read from ``RUN/train_log.jsonl`` (the learning rate each step ran with), drawn by the reports' one PNG writer.
  The loss axis is plain (no offset) and spans at least :data:`LOSS_SPAN` of the first step's loss, so a run whose
  loss barely moves shows a flat line, not its noise blown up to fill the panel.
- ``--report-to tensorboard|wandb``: transformers' own integrations (``TrainingArguments.report_to``), optional
  extras (``pip install tensorboardX`` or ``tensorboard``; ``pip install wandb``); TensorBoard's event files go to
  ``RUN/tensorboard/`` (unless ``TENSORBOARD_LOGGING_DIR`` says otherwise). Asking for one that is not installed is
  an error before any work.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from ropescale.common.io import InputError

REPORT_TO = ("none", "tensorboard", "wandb")
CURVES_PNG = "train_curves.png"
LOSS_SPAN = 0.1  # the loss axis spans at least this share of the first step's loss
LOG = "train_log.jsonl"
TENSORBOARD_DIR = "tensorboard"
_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}
_INSTALL = {"tensorboard": "pip install tensorboardX (or tensorboard)", "wandb": "pip install wandb"}


def check_report_to(name: str) -> None:
    """``--report-to``: one of :data:`REPORT_TO`, and its library importable (an InputError saying what to install)."""
    if name not in REPORT_TO:
        raise InputError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {name!r}")
    mods = _MODULES.get(name, ())
    if mods and not any(importlib.util.find_spec(m) is not None for m in mods):
        missing = (f"no {mods[0]} package is installed" if len(mods) == 1 else
                   f"neither {' nor '.join(mods)} is installed")
        raise InputError(f"--report-to {name}: {missing} ({_INSTALL[name]}); the loss-and-learning-rate PNG "
                         f"({CURVES_PNG}) is drawn into the run directory without it")


def report_to(name: str, run_dir: str | os.PathLike) -> list[str]:
    """``TrainingArguments.report_to`` for ``--report-to NAME`` (checked); TensorBoard writes into
    RUN/tensorboard/ (transformers' ``TENSORBOARD_LOGGING_DIR``, when the user has not set it)."""
    check_report_to(name)
    if name == "none":
        return []
    if name == "tensorboard":
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(run_dir) / TENSORBOARD_DIR))
    return [name]


def read_log(run_dir: str | os.PathLike) -> list[dict]:
    """The records of RUN/train_log.jsonl ({step, loss, lr, ...}), in step order, the last record of a step kept (a
    resumed run logs a step again); a torn last line of a killed run is left out. An InputError when there is no
    log or no record in it."""
    path = Path(run_dir) / LOG
    if not path.is_file():
        raise InputError(f"no {LOG} here: not a finetune run directory, or one stopped before its first step",
                         run_dir)
    steps: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            steps[int(rec["step"])] = rec
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    if not steps:
        raise InputError("no logged step yet", path)
    return [steps[k] for k in sorted(steps)]


def loss_limits(losses: list[float]) -> tuple[float, float]:
    """The loss axis: the losses' range, widened (about its middle, never below 0) to :data:`LOSS_SPAN` of the first
    step's loss when narrower."""
    vals = [v for v in losses if v is not None]
    lo, hi = min(vals), max(vals)
    need = LOSS_SPAN * abs(vals[0])
    if hi - lo < need:
        mid = (lo + hi) / 2
        lo, hi = mid - need / 2, mid + need / 2
        if lo < 0 <= min(vals):
            lo, hi = 0.0, need
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


def plot_curves(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draw the loss and the learning rate per logged step of a run (:func:`read_log`) into ``out`` (default
    RUN/train_curves.png), atomically; returns the path."""
    from ropescale.common.plot import save_png

    fig = curves_figure(read_log(run_dir), Path(run_dir).resolve().name)
    return save_png(fig, Path(out) if out is not None else Path(run_dir) / CURVES_PNG)


def curves_figure(recs: list[dict], name: str):
    """The figure of :func:`plot_curves`: loss and learning rate per logged step (records of :func:`read_log`)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    from ropescale.common.plot import fit_text

    steps = [r["step"] for r in recs]
    fig = Figure(figsize=(10.0, 3.8), dpi=110)
    loss_ax, lr_ax = fig.subplots(1, 2)
    loss_ax.plot(steps, [r.get("loss") for r in recs], marker="o" if len(recs) <= 40 else None, ms=3, lw=1.4)
    loss_ax.set_title("training loss (token mean over the labelled tokens of a step)", fontsize=9)
    lr_ax.plot(steps, [r.get("lr") for r in recs], marker="o" if len(recs) <= 40 else None, ms=3, lw=1.4,
               color="tab:orange")
    lr_ax.set_title("learning rate the step ran with", fontsize=9)
    from matplotlib.ticker import MaxNLocator

    for ax in (loss_ax, lr_ax):
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    lr_ax.set_ylim(bottom=0)
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if any(r.get("loss") is not None for r in recs):
        loss_ax.set_ylim(*loss_limits([r.get("loss") for r in recs]))
    loss_ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    fig.suptitle(f"{name}: {len(recs)} logged steps, {steps[0]}-{steps[-1]}", fontsize=10)
    fit_text(fig)
    fig.tight_layout()
    return fig
