"""``python -m ropescale.experiments run|report FILE`` (``ropescale experiment ...``): run an experiment file's arms
(resumable: a second call runs nothing and prints the table) or only report what its runs hold. The page
(OUT/NAME.md, or --page), results.json and run.json go to the work dir; the tables to stdout, progress to stderr."""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from ropescale.common.cli import Tool, add_overwrite
from ropescale.common.settings import add_settings, fmt, from_args, values

from .runner import ExperimentSettings

PROG = "python -m ropescale.experiments"


def register(name: str, what: str):
    def reg(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=what, description=what)
        p.add_argument("file", metavar="FILE", help="the experiment file (YAML, docs/experiments.md)")
        add_settings(p, ExperimentSettings)
        add_overwrite(p, "--page")
        p.set_defaults(func=lambda args: command(args, running=name == "run"))
        return p

    return reg


TOOL = Tool(PROG, __doc__.split("\n\n")[0], (register("run", "run the arms' runs not complete yet, then report"),
                                              register("report", "report what the runs hold, running nothing")))
main = TOOL.entry()


def command(args: argparse.Namespace, *, running: bool) -> int:
    st = from_args(args, ExperimentSettings)
    given = [f"{'--' + k.replace('_', '-')}" + ("" if v is True else f" {shlex.quote(fmt(v))}")
             for k, v in values(st).items() if v not in (None, False)]
    leaf = getattr(args, "_leaf", None)  # the subcommand's parser: its prog is the command as called
    prog = leaf.prog if leaf is not None else f"{PROG} {args.command}"
    return go(args.file, st, running, " ".join([prog, shlex.quote(args.file), *given]), overwrite=args.overwrite)


def page_target(target: Path, overwrite: bool) -> Path:
    """The page's path, checked before any run (the one output rule): new, this tool's own output, a page an
    experiment wrote (its reading marker: re-made with its reading kept), or anything with ``overwrite``."""
    from ropescale.common.io import claim_output_file

    from .page import READING

    ours = target.is_file() and READING in target.read_text(encoding="utf-8", errors="replace")
    return claim_output_file(target, "--page", overwrite=overwrite or ours)


def go(file: str, st: ExperimentSettings, running: bool, command: str, overwrite: bool = False) -> int:
    """Run (``running``) and report one experiment file with these settings."""
    from ropescale.common.io import (
        InputError,
        claim_output_file,
        foreign_entries,
        write_json_atomic,
        write_text_atomic,
    )
    from ropescale.common.runs.record import RunDir, RunRecord
    from ropescale.common.runs.resume import claim_run_dir, open_run_dir
    from ropescale.common.settings import to_record

    from . import collect, compare, page, runner, spec

    t0 = time.time()
    exp = spec.load(file, quick=st.quick)
    work = runner.work_dir(exp, st)
    arms, seeds = runner.plan(exp, st)
    rd = RunDir(work)
    was = (rd.read_meta().get("settings") or {}).get("quick") if (work / "run.json").is_file() else None
    if was is not None and bool(was) != exp.quick:
        raise InputError(f"{work} holds a {'--quick' if was else 'full'} run of this experiment, not a "
                         f"{'--quick' if exp.quick else 'full'} one: give another --out", file)
    if not running:
        runner.check_runs(exp, work, runner.plan(exp, replace(st, only=None))[0], seeds)
    target = page_target(Path(st.page) if st.page else work / f"{exp.name}.md", overwrite)
    if running:
        open_run_dir(work, "experiment")
        old = rd.read_meta() if rd.exists() else {}
        rec = RunRecord("experiment", settings={"file": str(Path(file)), **to_record(st)},
                        info={"name": exp.name, "arms": list(exp.arms), "seeds": list(seeds),
                              "lengths": list(exp.lengths), "experiment": Path(file).read_text(encoding="utf-8")},
                        created=old.get("created"), seconds=float(old.get("seconds") or 0.0))
        rd.write_record(rec)
        done = runner.run(exp, st, work)
        rec.status, rec.seconds = "complete", rec.seconds + (time.time() - t0)
        rec.info["ran"] = done["ran"]
        rd.write_record(rec)
    elif not work.is_dir():
        raise InputError(f"no runs of this experiment in {work} (run it first, or give --out)", file)
    else:  # a directory of other things (or another kind's run) is refused; its page may carry a reading edited in
        foreign = [e for e in foreign_entries(work) if e != target.name or target.parent != work]
        if foreign or (work / "run.json").is_file():
            claim_run_dir(work, "experiment")
    every = runner.plan(exp, replace(st, only=None))[0]  # --only picks what is run; the page reads every arm's runs
    data = collect.collect(exp, work, runner.readers(exp, every), seeds)
    res = compare.results(exp, data, seeds, collect.facts(exp, work, runner.readers(exp, every), seeds))
    wall = {"this": time.time() - t0, "runs": run_seconds(exp, work, every, seeds)}
    text = page.page(exp, res, command, wall, page.read_old(target))
    # the work directory is this experiment's (checked above): its results file is its own, recorded as written
    write_json_atomic(claim_output_file(work / "results.json", None, overwrite=True), compare.to_json(exp, res))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, text)
    runner.say(exp, f"page {target}, results {work / 'results.json'}")
    print(page.tables(exp, res))
    return 0


def run_seconds(exp, work: Path, arms, seeds) -> float:
    """The wall time the arms' runs recorded (run.json ``seconds``, summed)."""
    import json

    from .runner import lengths_of, run_dir

    total = 0.0
    for a in arms:
        for s in seeds:
            for t in lengths_of(exp, a):
                p = run_dir(work, a, s, t) / "run.json"
                if p.is_file():
                    try:
                        total += float(json.loads(p.read_text(encoding="utf-8")).get("seconds") or 0.0)
                    except (OSError, ValueError, TypeError):
                        pass
    return total


if __name__ == "__main__":
    sys.exit(main())
