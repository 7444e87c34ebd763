"""Running an experiment: its settings (:class:`ExperimentSettings`, recorded in the out dir's run.json), the prepared
files, then every arm x seed x length as an in-process call of a ``ropescale`` command's entry function with ``--out``
its run directory (WORK/runs/ARM/sSEED/TLENGTH) and ``--resume auto``. A run whose run.json says complete (and whose
score file is there) is not called again, so a second ``run`` runs nothing; each run and prepared file records the
flags it is made with (``argv.json``), and one made with other flags is refused or, with ``--rerun-changed``, moved
aside and made again (:func:`changed`). Progress on stderr: the arm, the seed, the length, and the time left by the
runs done."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .spec import Experiment, fill

T0 = time.time()
FINISHED = ("complete", "done")  # a run.json's status when its run finished (generate, probes; a fine-tune: done)


@dataclass
class ExperimentSettings:
    """What ``python -m ropescale.experiments run|report FILE`` was asked (the file's own content is recorded
    beside it in run.json)."""

    quick: bool = setting(False, "the file's quick: miniature (a test runs it)", resume="ignore")
    only: list[str] | None = setting(None, "run only these arms (comma-separated); the page reads every arm's runs",
                                     metavar="ARM", resume="ignore")
    seeds: list[int] | None = setting(None, "seeds (comma-separated; default: the file's)", resume="ignore")
    out: str | None = setting(None, "work directory (default: the file's work:, else runs/experiments/NAME; "
                                    "runs/experiments/NAME-quick with --quick)",
                              metavar="DIR", resume="ignore")
    page: str | None = setting(None, "the page's path (default OUT/NAME.md)", metavar="FILE", resume="ignore")
    rerun_changed: bool = setting(False, "re-run the runs (and prepared files) whose recorded flags differ from the "
                                  "file's now (the old ones moved aside to PATH.changed-N)", resume="ignore")


def say(exp: Experiment, msg: str) -> None:
    print(f"[experiment {exp.name} {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def work_dir(exp: Experiment, st: ExperimentSettings) -> Path:
    """--out; else the file's ``work:`` (a full run); else runs/experiments/NAME (NAME-quick for the quick)."""
    from ropescale.common.paths import REPO_ROOT

    if st.out:
        return Path(st.out)
    if exp.work and not exp.quick:
        return REPO_ROOT / exp.work
    return REPO_ROOT / "runs" / "experiments" / (exp.name + ("-quick" if exp.quick else ""))


def run_dir(work: Path, arm: str, seed: int, length: int | None) -> Path:
    """WORK/runs/ARM/sSEED/TLENGTH; an arm run once per seed (``length`` None): WORK/runs/ARM/sSEED."""
    d = work / "runs" / arm / f"s{seed}"
    return d if length is None else d / f"T{length}"


def lengths_of(exp: Experiment, arm: str) -> tuple:
    """The lengths an arm runs at: the experiment's (those its ``lengths:`` names), or (None,) for an arm run once
    per seed."""
    a = exp.arms[arm]
    return tuple(t for t in exp.lengths if not a.lengths or t in a.lengths) if a.per_length else (None,)


def prepare_of(exp: Experiment, length: int | None) -> list[str]:
    """The prepared files of one length (``None``: those made once per seed: their paths name no {length})."""
    from .spec import placeholders

    return [k for k, (out, _) in exp.prepare.items() if length is not None or "length" not in placeholders((out,))]


def values(exp: Experiment, work: Path, seed: int, length: int | None) -> dict:
    """What the placeholders of one seed and length stand for: the vars, the prepared files, seed, length, work
    (``length`` None: an arm run once per seed, which names neither {length} nor a file made per length)."""
    v = {k: x if isinstance(x, (list, tuple)) else str(x) for k, x in exp.vars.items()}
    v.update(seed=str(seed), work=str(work), **({} if length is None else {"length": str(length)}))
    for name in prepare_of(exp, length):
        v[name] = str(work / fill([exp.prepare[name][0]], v, f"prepare {name}")[0])
    return v


def score_files(exp: Experiment, arm: str) -> list[str]:
    """The score files an arm's runs hold (one per file its scores name)."""
    return list(dict.fromkeys(sc.file for k, sc in exp.scores.items() if exp.arms[arm].has(k)))


def finished(run: Path) -> bool:
    """Whether a run directory's run.json says it finished (a run still going, or stopped part-way, holds some of its
    records: read, they would make a row of fewer samples than its flags ask)."""
    try:
        return json.loads((run / "run.json").read_text(encoding="utf-8")).get("status") in FINISHED
    except (OSError, ValueError):
        return False


def complete(run: Path, exp: Experiment, arm: str) -> bool:
    """A finished run whose score files are there."""
    return finished(run) and all((run / f).is_file() for f in score_files(exp, arm))


def prepared(path: Path) -> bool:
    """A prepared file is there; a prepared run directory (a fine-tune: run.json) is finished."""
    if path.is_dir() and (path / "run.json").is_file():
        return finished(path)
    return path.exists()


ARGV = "argv.json"  # beside a run's record: the flags it was called with ({work} for the work directory)


def beside(path: Path) -> Path:
    """Where the flags a prepared output was made with are: ``PATH.argv.json`` beside it (a run's: RUN/argv.json)."""
    return path.parent / (path.name + ".argv.json")


def portable(argv: list[str], work: Path) -> list[str]:
    """The flags with the work directory written ``{work}`` (a copied work directory reads the same)."""
    return [x.replace(str(work), "{work}") for x in argv]


def recorded(side: Path) -> dict | None:
    """The recorded flags ``{"argv": [...], "prepared": {NAME: [...]}}`` (None: none recorded, a run made before
    they were)."""
    if not side.is_file():
        return None
    try:
        v = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        v = None
    if not isinstance(v, dict) or not isinstance(v.get("argv"), list):
        raise InputError("unreadable flags record (expected {\"argv\": [...]})", side)
    return {"argv": v["argv"], "prepared": v.get("prepared") or {}}


def flag_diff(old: list, new: list) -> str:
    """``--n 8 -> --n 16; (none) -> --dca``: what differs between two flag lists."""
    import difflib

    ops = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
    return "; ".join(f"{' '.join(old[i1:i2]) or '(none)'} -> {' '.join(new[j1:j2]) or '(none)'}"
                     for op, i1, i2, j1, j2 in ops if op != "equal")


def record_diff(old: dict, new: dict) -> str:
    """What differs between two flag records: the flags, then each prepared file's (``prepare NAME: ...``)."""
    out = [flag_diff(old["argv"], new["argv"])] if old["argv"] != new["argv"] else []
    for k in sorted({*old["prepared"], *new["prepared"]}):
        a, b = old["prepared"].get(k, []), new["prepared"].get(k, [])
        if a != b:
            out.append(f"prepare {k}: {flag_diff(a, b)}")
    return "; ".join(out)


def record_argv(side: Path, rec: dict) -> None:
    """Write the flags a run or prepared output is made with (atomically, before it is made)."""
    from ropescale.common.io import claim_output_file, write_json_atomic

    side.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(claim_output_file(side, None, overwrite=True), rec)


def move_aside(path: Path, side: Path) -> Path:
    """``path`` renamed to the first free ``PATH.changed-N`` (its flags record ``side`` with it); the new path."""
    n = 1
    while path.with_name(f"{path.name}.changed-{n}").exists():
        n += 1
    new = path.with_name(f"{path.name}.changed-{n}")
    path.rename(new)
    if side.parent != path and side.is_file():
        side.rename(beside(new))
    return new


def changed(what: str, path: Path, side: Path, recs: list[dict], rerun: bool, exp: Experiment) -> bool:
    """Whether ``path`` was made with flags none of ``recs`` are (then moved aside with ``rerun``, else refused in
    one line naming it and the flags that differ from the first); a path with no flags recorded is taken as it is."""
    was = recorded(side)
    if was is None or was in recs:
        return False
    if not rerun:
        raise InputError(f"{what}: {path} was made with other flags ({record_diff(was, recs[0])}): --rerun-changed "
                         f"re-runs it (the old one moved aside), or give another --out", exp.path)
    say(exp, f"{what}: flags changed ({record_diff(was, recs[0])}): {path} moved to {move_aside(path, side)}")
    return True


def prepare_argv(exp: Experiment, work: Path, v: dict, name: str) -> list[str]:
    """The flags a prepared file is made with (``v``: :func:`values` of its seed and length), ``{work}`` portable."""
    return portable(fill(exp.prepare[name][1], dict(v, out=v[name]), f"prepare {name}"), work)


def arm_record(exp: Experiment, work: Path, arm: str, seed: int, length: int | None) -> dict:
    """The flags an arm's run at one seed and length is called with (before ``--out`` / ``--resume``) and those of
    the prepared files it reads, ``{work}`` portable."""
    rd = run_dir(work, arm, seed, length)
    v = dict(values(exp, work, seed, length), run=str(rd), out=str(rd))
    return {"argv": portable(fill(exp.arms[arm].run, v, f"arm {arm}"), work),
            "prepared": {n: prepare_argv(exp, work, v, n) for n in sorted(needs(exp, [arm])) if n in v}}


def check_runs(exp: Experiment, work: Path, arms, seeds, rerun: tuple = ()) -> None:
    """Every run of ``arms`` there was made with the flags the file gives it now; a changed one of the arms in
    ``rerun`` is moved aside (run again), any other refused (:func:`changed`)."""
    for a in arms:
        for s in seeds:
            for t in lengths_of(exp, a):
                rd = run_dir(work, a, s, t)
                if (rd / ARGV).is_file():
                    changed(f"arm {a}", rd, rd / ARGV, [arm_record(exp, work, a, s, t)], a in rerun, exp)


def check_prepared(exp: Experiment, work: Path, seeds, rerun: bool) -> None:
    """Every prepared file there was made with the flags the file gives it now (:func:`changed`); one made once a
    seed whose flags name ``{length}`` is made at the first length that needs it: the flags of any length match."""
    from .spec import placeholders

    for s in seeds:
        recs: dict = {}
        for t in (None, *exp.lengths):
            v = values(exp, work, s, t)
            for name in prepare_of(exp, t):
                if t is None and "length" in placeholders(exp.prepare[name][1]):
                    continue
                recs.setdefault(v[name], (name, []))[1].append({"argv": prepare_argv(exp, work, v, name),
                                                               "prepared": {}})
        for path, (name, rs) in recs.items():
            out = Path(path)
            if out.exists():
                changed(f"prepare {name}", out, beside(out), rs, rerun, exp)


def own_process(argv: list[str]) -> bool:
    """A fine-tune (not its merge) runs in a process of its own: DeepSpeed keeps its process groups in module state,
    and a second fine-tune in one process finds the first one's torn-down groups ("Group ... is not registered")."""
    return argv[0] == "finetune" and argv[1:2] != ["merge"]


def call(argv: list[str], where: str) -> None:
    """``ropescale ARGV`` in this process (the command's own entry function; its stdout, logs, goes to stderr), a
    fine-tune as ``python -m ropescale ARGV`` (:func:`own_process`)."""
    import subprocess

    from ropescale.commands import TOOLS

    tool, rest = argv[0], argv[1:]
    print("  $ ropescale " + " ".join(argv), file=sys.stderr, flush=True)
    if own_process(argv):
        try:  # its output streams to our stderr; a stderr without a file (a test's capture) gets it at the end
            fd = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        done = subprocess.run([sys.executable, "-m", "ropescale", *argv], text=True, errors="replace",
                              **({"stdout": fd} if fd is not None else
                                 {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}))
        if fd is None:
            sys.stderr.write(done.stdout)
        rc = done.returncode
    else:
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


def needs(exp: Experiment, arms) -> set:
    """The prepared files these arms' flags name, with the ones those are made from."""
    from .spec import placeholders

    todo = [n for a in arms for n in placeholders(exp.arms[a].run) if n in exp.prepare]
    out: set = set()
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo += [m for m in placeholders(exp.prepare[n][1]) if m in exp.prepare]
    return out


def make_scores(exp: Experiment, arm: str, rd: Path, v: dict) -> None:
    """Each score file of the arm missing after its run made by its score's ``make`` (once per file)."""
    for f in score_files(exp, arm):
        make = next((sc.make for k, sc in exp.scores.items() if sc.file == f and exp.arms[arm].has(k) and sc.make),
                    ())
        if make and not (rd / f).is_file():
            call(fill(make, v, "score make"), f"arm {arm}: score")
        if not (rd / f).is_file():
            raise InputError(f"arm {arm}: {rd} has no {f} after its run (score: file / make)", exp.path)


def run(exp: Experiment, st: ExperimentSettings, work: Path) -> dict:
    """Every prepared file and every running arm's runs not complete yet; returns {"ran": runs called,
    "seconds": ...}."""
    arms, seeds = plan(exp, st)
    check_runs(exp, work, plan(exp, replace(st, only=None))[0], seeds, tuple(arms) if st.rerun_changed else ())
    check_prepared(exp, work, seeds, st.rerun_changed)
    every = [(a, s, t) for a in arms for s in seeds for t in lengths_of(exp, a)]
    todo = [(a, s, t) for a, s, t in every if not complete(run_dir(work, a, s, t), exp, a)]
    per = sorted({len(lengths_of(exp, a)) for a in arms})
    say(exp, f"{len(arms)} arms x {len(seeds)} seeds x {'/'.join(map(str, per))} lengths: {len(every)} runs, "
             f"{len(every) - len(todo)} complete already, {len(todo)} to run")
    for s in seeds:
        for t in (None, *exp.lengths):
            here = [a for a, s2, t2 in todo if (s2, t2) == (s, t)]
            if not here:
                continue
            need = needs(exp, here)
            v = values(exp, work, s, t)
            for name in [k for k in prepare_of(exp, t) if k in need]:
                out = Path(v[name])
                if not prepared(out):
                    say(exp, f"prepare {name} (seed {s}{'' if t is None else f', T{t}'})")
                    record_argv(beside(out), {"argv": prepare_argv(exp, work, v, name), "prepared": {}})
                    call(fill(exp.prepare[name][1], dict(v, out=v[name]), f"prepare {name}"), f"prepare {name}")
    t_start, done = time.time(), 0
    for k, (a, s, t) in enumerate(todo):
        left = "" if not done else f"; about {(time.time() - t_start) / done * (len(todo) - k):.0f} s left"
        where = "every length" if t is None else f"T{t}"
        say(exp, f"arm {a} ({arms.index(a) + 1}/{len(arms)}), seed {s}, {where}: run {k + 1} of {len(todo)}{left}")
        rd = run_dir(work, a, s, t)
        rd.parent.mkdir(parents=True, exist_ok=True)
        v = dict(values(exp, work, s, t), run=str(rd), out=str(rd))
        rd.mkdir(exist_ok=True)
        record_argv(rd / ARGV, arm_record(exp, work, a, s, t))
        call(fill(exp.arms[a].run, v, f"arm {a}") + ["--out", str(rd), "--resume", "auto"], f"arm {a}")
        make_scores(exp, a, rd, v)
        done += 1
    return {"ran": done, "seconds": round(time.time() - t_start, 1)}
