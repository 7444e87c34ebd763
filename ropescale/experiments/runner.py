"""Running an experiment: its settings (:class:`ExperimentSettings`, recorded in the out dir's run.json), the prepared
files, then every arm x seed x length as an in-process call of a ``ropescale`` command's entry function with ``--out``
its run directory (WORK/runs/ARM/sSEED/TLENGTH) and ``--resume auto``. A run whose run.json says complete (and whose
score file is there) is not called again, so a second ``run`` runs nothing. Progress on stderr: the arm, the seed,
the length, and the time left by the runs done."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .spec import Experiment, fill

T0 = time.time()


@dataclass
class ExperimentSettings:
    """What ``python -m ropescale.experiments run|report FILE`` was asked (the file's own content is recorded
    beside it in run.json)."""

    quick: bool = setting(False, "the file's quick: miniature (a test runs it)", resume="ignore")
    only: list[str] | None = setting(None, "run only these arms (comma-separated); the page shows what is there",
                                     metavar="ARM", resume="ignore")
    seeds: list[int] | None = setting(None, "seeds (comma-separated; default: the file's)", resume="ignore")
    out: str | None = setting(None, "work directory (default runs/experiments/NAME, NAME-quick with --quick)",
                              metavar="DIR", resume="ignore")
    page: str | None = setting(None, "the page's path (default OUT/NAME.md)", metavar="FILE", resume="ignore")


def say(exp: Experiment, msg: str) -> None:
    print(f"[experiment {exp.name} {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def work_dir(exp: Experiment, st: ExperimentSettings) -> Path:
    from ropescale.common.paths import REPO_ROOT

    return Path(st.out) if st.out else REPO_ROOT / "runs" / "experiments" / (exp.name + ("-quick" if exp.quick else ""))


def run_dir(work: Path, arm: str, seed: int, length: int) -> Path:
    return work / "runs" / arm / f"s{seed}" / f"T{length}"


def values(exp: Experiment, work: Path, seed: int, length: int) -> dict:
    """What the placeholders of one seed and length stand for: the vars, the prepared files, seed, length, work."""
    v = {k: x if isinstance(x, (list, tuple)) else str(x) for k, x in exp.vars.items()}
    v.update(seed=str(seed), length=str(length), work=str(work))
    for name, (out, _) in exp.prepare.items():
        v[name] = str(work / fill([out], v, f"prepare {name}")[0])
    return v


def complete(run: Path, exp: Experiment) -> bool:
    """A finished run: run.json says complete and the score file is there."""
    rj = run / "run.json"
    if not rj.is_file() or not (run / exp.score.file).is_file():
        return False
    try:
        return json.loads(rj.read_text(encoding="utf-8")).get("status") == "complete"
    except (OSError, ValueError):
        return False


def prepared(path: Path) -> bool:
    """A prepared file is there; a prepared run directory (a fine-tune: run.json) is complete."""
    rj = path / "run.json"
    if path.is_dir() and rj.is_file():
        try:
            return json.loads(rj.read_text(encoding="utf-8")).get("status") == "complete"
        except (OSError, ValueError):
            return False
    return path.exists()


def call(argv: list[str], where: str) -> None:
    """``ropescale ARGV`` in this process (the command's own entry function; its stdout, logs, goes to stderr)."""
    from ropescale.commands import TOOLS

    tool, rest = argv[0], argv[1:]
    print("  $ ropescale " + " ".join(argv), file=sys.stderr, flush=True)
    with contextlib.redirect_stdout(sys.stderr):
        try:
            rc = TOOLS[tool][0]()(rest)
        except SystemExit as e:  # argparse's exit on a bad flag
            rc = e.code if isinstance(e.code, int) else 2
    if rc:
        raise InputError(f"{where}: `ropescale {' '.join(argv)}` failed (exit {rc})")


def plan(exp: Experiment, st: ExperimentSettings) -> tuple[list[str], tuple]:
    arms = [a for a in exp.arms if exp.arms[a].reads is None]
    if st.only:
        bad = [a for a in st.only if a not in exp.arms]
        if bad:
            raise InputError(f"--only: {bad[0]!r} is not an arm of this experiment ({', '.join(exp.arms)})", exp.path)
        arms = [a for a in arms if a in st.only]
    return arms, tuple(st.seeds or exp.seeds)


def readers(exp: Experiment, arms) -> list[str]:
    """``arms`` and the arms that read their runs (``reads:``)."""
    return [a for a in exp.arms if a in arms or exp.arms[a].reads in arms]


def run(exp: Experiment, st: ExperimentSettings, work: Path) -> dict:
    """Every prepared file and every running arm's runs not complete yet; returns {"ran": runs called,
    "seconds": ...}."""
    arms, seeds = plan(exp, st)
    todo = [(a, s, t) for a in arms for s in seeds for t in exp.lengths
            if not complete(run_dir(work, a, s, t), exp)]
    total = len(arms) * len(seeds) * len(exp.lengths)
    say(exp, f"{len(arms)} arms x {len(seeds)} seeds x {len(exp.lengths)} lengths: {total} runs, "
             f"{total - len(todo)} complete already, {len(todo)} to run")
    for s in seeds:
        for t in exp.lengths:
            v = values(exp, work, s, t)
            for name, (_, flags) in exp.prepare.items():
                if not prepared(Path(v[name])) and any((a, s, t) in todo for a in arms):
                    say(exp, f"prepare {name} (seed {s}, T{t})")
                    Path(v[name]).parent.mkdir(parents=True, exist_ok=True)
                    call(fill(flags, dict(v, out=v[name]), f"prepare {name}"), f"prepare {name}")
    t_start, done = time.time(), 0
    for k, (a, s, t) in enumerate(todo):
        left = "" if not done else f"; about {(time.time() - t_start) / done * (len(todo) - k):.0f} s left"
        say(exp, f"arm {a} ({arms.index(a) + 1}/{len(arms)}), seed {s}, T{t}: run {k + 1} of {len(todo)}{left}")
        rd = run_dir(work, a, s, t)
        rd.parent.mkdir(parents=True, exist_ok=True)
        v = dict(values(exp, work, s, t), run=str(rd), out=str(rd))
        call(fill(exp.arms[a].run, v, f"arm {a}") + ["--out", str(rd), "--resume", "auto"], f"arm {a}")
        if exp.score.make and not (rd / exp.score.file).is_file():
            call(fill(exp.score.make, v, "score make"), f"arm {a}: score")
        if not (rd / exp.score.file).is_file():
            raise InputError(f"arm {a}: {rd} has no {exp.score.file} after its run (score: file / make)", exp.path)
        done += 1
    return {"ran": done, "seconds": round(time.time() - t_start, 1)}
