"""What every probe shares: model loading with the rope flags, the common CLI flags, and the run directory.

Every probe's settings are a :class:`ProbeSettings` (model, output, data, sizes, seed, the RoPE spec nested) plus
its own fields, declared beside the probe: the flags, a ``--recipe``, the run.json record and the resume check
come from them (``ropescale.common.settings``).

A probe run directory has the same shape as generation's (ropescale.common.runs): ``run.json`` (the run record:
kind "probe", model, model_id, rope spec, context, the model's training record, data, the settings as resolved;
``info``: the probe's name, lengths, metric, column and variant label), ``items.jsonl`` (one record per scored item,
each with ``id``, ``group``, ``col`` and ``value``: the report's row group, column bucket and cell metric) and
``summary.json`` (the cells: mean value and count per group x column). Re-running into the same directory with the
same settings and model resumes (``--resume auto``, the default; ``--resume never`` refuses it): items already in
``items.jsonl`` are skipped; a directory holding another run
(other settings, another model, another kind) is refused. The directory and its run.json are written with the
first result: a run that fails before producing one (bad lengths, too-short data, ...) leaves nothing behind, so
the corrected command can use the same ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rope_scaling import RopeSpec
from rope_scaling.load import load_config
from rope_scaling.load import load_model as load_lm
from ropescale.common.cli import rerun_command, when_interrupted
from ropescale.common.models import MODEL_HELP, resolve_model
from ropescale.common.paths import CHAPTERS_JSONL
from ropescale.common.runs.identity import model_id, model_ref
from ropescale.common.runs.record import (
    ITEMS,
    SUMMARY,
    RunDir,
    RunMeta,
    RunRecord,
    now,
    read_train_record,
    settings_record,
    summarize,
)
from ropescale.common.runs.resume import check_resume, open_run_dir
from ropescale.common.settings import check, make, nested, setting


# ---------------------------------------------------------------- model
@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    path: Path
    name: str  # what the user passed (``tiny`` or a path)
    rope: dict  # the effective rope spec dict (read back from the config after applying the flags)
    scale: float
    orig_ctx: int
    context: int | None  # the context the setting serves (rope_scaling.hf.served_context); None = unbounded (DCA)
    model_id: str | None = None  # ropescale.common.runs.identity.model_id of the directory
    train: dict | None = None  # the model's training record (ropescale.common.runs.record.read_train_record)
    rope_context: int | None = None  # the frequency method's extended context (rope_scaling.hf.extended_context)

    @property
    def default_length(self) -> int | None:
        """A probe's default length: the context the setting serves, the frequencies' where that is unbounded."""
        return self.context if self.context is not None else self.rope_context

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        for v in (t.pad_token_id, t.eos_token_id, 0):
            if v is not None:
                return int(v)
        return 0


def load_model(name: str | os.PathLike | None, spec=None) -> Loaded:
    """Resolve ``name`` (``tiny`` or an HF model dir), apply the rope spec to its config, then load the model
    (fp32, eval, CPU) and tokenizer -- through rope_scaling.load, as every stage (a config that already carries
    rope scaling plus a scaling flag needs ``--replace``)."""
    import torch
    from transformers import AutoTokenizer

    path = resolve_model(name)
    cfg = load_config(path, spec)  # read once: the spec, context and original context below all come from it
    model = load_lm(path, cfg.config, dtype=torch.float32, attn="sdpa", state=cfg.state)
    model.float().eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    return Loaded(model, tok, Path(path), str(name or "tiny"), cfg.rope.to_dict(), float(cfg.rope.scale or 1.0),
                  int(cfg.orig_ctx), cfg.context, model_id(path), read_train_record(path), cfg.rope_context)


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- settings and CLI
POSITIVE = (lambda v: v > 0, "positive")
NOT_NEGATIVE = (lambda v: v >= 0, "not be negative")
DOCS_HELP = ("documents JSONL ({text} or {context}), chapters JSONL (one document per book) or a plain .txt file (one "
             "document)")


def data_setting(help: str):
    """The ``--data`` setting with a probe's own description of what it reads."""
    return setting(str(CHAPTERS_JSONL), help + "; default: the shared novels (with --model tiny: only the chapters "
                                               "its build held out from training)", metavar="FILE", show_default=False)


@dataclass(frozen=True)
class ProbeSettings:
    """What every probe takes; a probe's own settings subclass it (``class PplSettings(ProbeSettings)``)."""

    model: str = setting("tiny", MODEL_HELP, resume="path")
    out: str | None = setting(None, "run directory to write (resumed when it holds a run with the same settings)",
                              metavar="DIR", required=True, resume="ignore")
    data: str = data_setting(DOCS_HELP)
    n: int = setting(8, "number of items (examples) per column", check=POSITIVE)
    seed: int = setting(0, "random seed: the run is deterministic given it")
    batch_size: int = setting(4, "sequences per forward pass", check=POSITIVE, resume="ignore")
    threads: int = setting(0, "torch CPU threads (0: torch's default)", check=NOT_NEGATIVE, resume="ignore")
    rope: RopeSpec = nested(RopeSpec, resume="ignore")  # resume compares the rope the model runs with


def probe_settings(cls, settings=None, fields: dict | None = None):
    """A probe's settings from Python: an instance, or its fields as keywords (``copy_probe(loaded, docs,
    length=200, n=2, out=...)``); checked."""
    fields = dict(fields or {})
    out = settings if settings is not None and not fields else make(cls, settings, **fields)
    check(out)
    return out


def default_lengths(orig_ctx: int) -> list[int]:
    """1x .. 8x the original context: orig, 2*orig, ..., 8*orig."""
    return [orig_ctx * i for i in range(1, 9)]


def rng_for(seed: int, *parts: Any) -> random.Random:
    """A deterministic RNG for one item (independent of iteration order)."""
    return random.Random("|".join(map(str, (seed,) + parts)))


# ---------------------------------------------------------------- run dir
class ProbeRun:
    """A probe's run directory: meta, resumable item log, summary. Creating one only checks ``out`` (a directory
    or nothing; an existing run must have the same settings); the directory and run.json are written with the
    first result (:meth:`add`) or at :meth:`finish`, so a run that fails before its first result leaves nothing.
    ``settings``: the probe's settings as resolved (defaults that depend on the model filled in). ``cell_kind``: what
    the probe's cells are, recorded for the report's intervals: ``"proportion"`` (0/1 items: Wilson's interval),
    ``"share"`` (per-item shares in [0, 1], e.g. RULER's string_match_all: the mean's interval, kept within [0, 1]),
    ``"mean"`` (per-item numbers: ``stats.means.cell``), None (an older run: decided from the items). ``variant``:
    the probe's variant reader (what tells apart its runs beyond the model, its RoPE spec and training, read from the
    run record); its answer is recorded as ``info.variant_label`` (empty without one), the report's row label."""

    def __init__(self, probe: str, loaded: Loaded, settings: ProbeSettings, lengths: list[int], *, metric: str = "",
                 column: str = "", cell_kind: str | None = None, variant: Callable[[RunMeta], str] | None = None):
        self.t_start = time.time()
        out, old = open_run_dir(settings.out, "probe")  # a file, or another kind of run's directory: refused
        when_interrupted(f"the items so far are kept; to continue, run the same command again: {rerun_command()}")
        self.dir = RunDir(out)
        model = model_ref(loaded.name, loaded.path)
        settings = dataclasses.replace(settings, model=model)  # the model as loaded (tiny or its path)
        self.before = old.seconds if old is not None else 0.0
        self.rec = RunRecord("probe", model=model, model_id=loaded.model_id, rope=loaded.rope, context=loaded.context,
                             train=loaded.train, data=settings.data, settings=settings_record(settings),
                             info={"probe": probe, "lengths": lengths, "metric": metric, "column": column,
                                   "cell_kind": cell_kind, "orig_ctx": loaded.orig_ctx}, seconds=self.before)
        self.rec.info["variant_label"] = variant(RunMeta(self.dir.path, self.rec.to_json())) if variant else ""
        if old is not None:
            check_resume(old, settings, rope=RopeSpec.from_record(loaded.rope), model_id=loaded.model_id,
                         also=[("probe", old.get("probe"), probe)], hint="use a new --out")
            self.rec.created = old.get("created", now())
        self.meta = {"probe": probe, "metric": metric, "column": column, "model": model, "rope": loaded.rope,
                     "scale": loaded.scale, "cell_kind": cell_kind}
        self.log = self.dir.log(ITEMS)
        self._started = False

    def start(self) -> None:
        """Create the directory and write run.json (once): called with the first result."""
        if not self._started:
            self.dir.path.mkdir(parents=True, exist_ok=True)
            self.dir.write_record(self.rec)
            self._started = True

    def done(self, rid: str) -> bool:
        return rid in self.log

    def add(self, record: dict) -> None:
        self.start()
        self.log.append(record)

    def finish(self, extra: dict | None = None) -> dict:
        self.start()
        summary = summarize(self.log.records())
        summary.update({"probe": self.meta["probe"], "metric": self.meta["metric"],
                        "column": self.meta["column"], "model": self.meta["model"], "rope": self.meta["rope"],
                        "scale": self.meta["scale"], "cell_kind": self.meta["cell_kind"]})
        if extra:
            summary.update(extra)
        self.dir.write_json(SUMMARY, summary)
        self.rec.status = "complete"
        self.rec.seconds = round(self.before + time.time() - self.t_start, 2)
        self.rec.info.update(finished=now(), items=len(self.log))
        self.dir.write_record(self.rec)
        return summary


def set_threads(n: int) -> None:
    if n and n > 0:
        import torch

        torch.set_num_threads(n)


def progress(iterable, desc: str, total: int | None = None):
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, unit="item", leave=False)


RunFn = Callable[[argparse.Namespace], int]
