"""A probe's command: its settings' flags, a --recipe and --json; read the data, load the model, run, print.

Each probe module registers itself with :func:`register_probe`, naming how its data is read and how it runs; the
command (:func:`cmd_probe`) is the same for all of them.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from ropescale.common.cli import add_command, add_json, add_resume, doc_sections
from ropescale.common.io import check_output_dir
from ropescale.common.runs.record import ITEMS, RecordLog
from ropescale.common.runs.resume import check_resume_mode, claim_run_dir
from ropescale.common.settings import add_settings, from_args, given
from ropescale.evaluation.report.probes import print_summary, with_intervals

from .common import ProbeSettings, load_model, set_threads
from .data import heldout_default, load_docs


def book_docs(s: ProbeSettings):
    """The documents of a probe that reads running text: ``--data`` (or the held-out chapters), its last chapters."""
    return load_docs(s.data, s.tail_chapters)


def register_probe(sub, name: str, cls, *, help: str, description: str, run: Callable,
                   load: Callable[[ProbeSettings], object] = book_docs, more: str | None = None
                   ) -> argparse.ArgumentParser:
    """A probe's subcommand: ``load(settings)`` reads its data (default: :func:`book_docs`),
    ``run(loaded, data, settings)`` returns the summary; ``more``: the page --help points to."""
    ap = add_command(sub, name, help=help, **doc_sections(description, 2, more=more or f"docs/probes.md ({name})"))
    add_settings(ap, cls)
    add_resume(ap, "auto")
    add_json(ap, "the summary")
    ap.set_defaults(func=cmd_probe, load=load, run=run)
    return ap


def settings_from_args(args: argparse.Namespace):
    """defaults < --recipe < the flags given, for the probe's own settings class; without --data, a tiny build
    reads the chapters it held out (:func:`.data.heldout_default`)."""
    return heldout_default(from_args(args), "data" in given(args, args.settings_class))


def prepare(s: ProbeSettings, load_data, resume: str = "auto"):
    """Check ``--out`` (with ``resume`` "never", that it holds no probe run), set the thread count, read the data
    (``load_data()``, first, so a bad file fails before a model loads) and load the model with the RoPE flags.
    Returns (data, Loaded)."""
    check_resume_mode(claim_run_dir(check_output_dir(s.out), "probe"), resume)
    set_threads(s.threads)
    data = load_data()
    return data, load_model(s.model, s.rope)


def cmd_probe(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    data, loaded = prepare(s, lambda: args.load(s), args.resume)
    summary = args.run(loaded, data, s)
    print_summary(with_intervals(summary, RecordLog(Path(s.out) / ITEMS).records()), args.json)
    return 0
