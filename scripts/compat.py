"""`make compat`: pyproject.toml's ranges tested at both ends, before the lock is refreshed.

Two throw-away venvs under .cache/compat/ (ignored; built afresh each time and removed afterwards unless --keep;
scripts/envbuild.py: torch pinned to the CPU wheel, deepspeed without build isolation, pip check):

- newest: the newest releases the ranges allow (what `make lock` would freeze today);
- lowest: transformers, peft, accelerate, deepspeed and datasets at their declared minimums (``>=X``), the rest
  whatever pip resolves with them.

The whole test suite runs in each (one after the other: the suite takes both cores), each run's log is kept
(.cache/compat/logs/DATE-SIDE.log, with the build's pip output and the pytest output), and a table of versions,
passed/failed counts, exit status and minutes is printed (and written to .cache/compat/table.md and
logs/DATE-table.md). Exit status 1 when a side fails. ``--side lowest --pin transformers==5.1.0 --
tests/test_generate.py`` bisects a bound.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import envbuild  # beside this file: python puts a script's directory first on sys.path

SHOWN = ("torch", "transformers", "peft", "accelerate", "deepspeed", "datasets", "tokenizers", "huggingface-hub",
         "safetensors", "numpy")
LOWEST = ("transformers", "peft", "accelerate", "deepspeed", "datasets")
WORK = envbuild.ROOT / ".cache" / "compat"


def side_pins(side: str, extra: list[str]) -> list[str]:
    """The pins of a side: lowest = each of :data:`LOWEST` at its declared minimum; ``extra`` overrides."""
    pins: dict[str, str] = {}
    if side == "lowest":
        for n in LOWEST:
            lo = envbuild.lower_bound(n)
            if lo is None:
                raise SystemExit(f"[compat] {n} has no lower bound (>=X) in pyproject.toml or "
                                 "requirements-deepspeed.txt")
            pins[n] = f"{n}=={lo}"
    for p in extra:
        pins[envbuild.canon(p.split("=")[0].split("<")[0].split(">")[0].strip())] = p
    return list(pins.values())


def run_tests(venv: Path, out: Path, log, pytest_args: list[str]) -> dict:
    """The suite (or ``pytest_args``) under ``venv``'s python: counts from its JUnit XML, exit status, seconds."""
    xml = out / "junit.xml"
    xml.unlink(missing_ok=True)
    env = dict(os.environ, ROPESCALE_CACHE=str(out / "cache"))  # nothing cached by another library version
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", f"--junitxml={xml}", *pytest_args]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=envbuild.ROOT, env=env).returncode
    res = {"rc": rc, "seconds": time.time() - t0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if xml.is_file():
        suites = ET.parse(xml).getroot()
        for s in suites.iter("testsuite"):
            n, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
            res["failed"] += f
            res["errors"] += e
            res["skipped"] += sk
            res["passed"] += n - f - e - sk
        res["failing"] = sorted({c.get("classname", "") + "::" + c.get("name", "") for c in suites.iter("testcase")
                                 if c.find("failure") is not None or c.find("error") is not None})
    return res


def one_side(side: str, pins: list[str], pytest_args: list[str], stamp: str, keep: bool = False) -> dict:
    out = WORK / side
    out.mkdir(parents=True, exist_ok=True)
    (WORK / "logs").mkdir(exist_ok=True)
    log_path = WORK / "logs" / f"{stamp}-{side}.log"
    row = {"side": side, "pins": pins, "log": str(log_path.relative_to(envbuild.ROOT)), "versions": {}}
    print(f"[compat] {side}: building {out / 'venv'} ({' '.join(pins) or 'newest'}); log {row['log']}",
          file=sys.stderr, flush=True)
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            row["versions"] = envbuild.build(out / "venv", pins, log=log)
        except envbuild.BuildError as e:
            row.update(rc="build failed", error=str(e), seconds=time.time() - t0)
            print(f"[compat] {side}: build failed: {e}", file=sys.stderr)
            return row
        row["build_seconds"] = time.time() - t0
        print(f"[compat] {side}: built in {row['build_seconds']:.0f} s; running the tests", file=sys.stderr,
              flush=True)
        row.update(run_tests(out / "venv", out, log, pytest_args))
    if not keep:  # throw-away: 1.5 GB each; the log and the versions stay
        import shutil

        shutil.rmtree(out / "venv", ignore_errors=True)
        shutil.rmtree(out / "cache", ignore_errors=True)
    print(f"[compat] {side}: {row['passed']} passed, {row['failed'] + row['errors']} failed, exit {row['rc']} "
          f"({row['seconds'] / 60:.1f} min)", file=sys.stderr, flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ["side"] + list(SHOWN) + ["passed", "failed", "exit", "build + tests"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        v = r["versions"]
        cells = [r["side"]] + [v.get(n, "-") for n in SHOWN]
        if r.get("rc") == "build failed":
            cells += ["-", "-", "build failed", f"{r['seconds'] / 60:.1f} min"]
        else:
            cells += [str(r["passed"]), str(r["failed"] + r["errors"]), str(r["rc"]),
                      f"{r['build_seconds'] / 60:.1f} + {r['seconds'] / 60:.1f} min"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="make compat", description=__doc__.split("\n\n")[0],
                                epilog="arguments after -- go to pytest (default: the whole suite)")
    p.add_argument("--side", choices=("newest", "lowest", "both"), default="both")
    p.add_argument("--pin", action="append", default=[], metavar="PKG==VER",
                   help="pin a package on the side(s) run (overrides the side's own pin); repeatable")
    p.add_argument("--keep", action="store_true", help="keep the venvs afterwards (.cache/compat/SIDE/venv)")
    a, rest = p.parse_known_args(argv)
    pytest_args = [x for x in rest if x != "--"]  # pytest.ini already says -q
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    sides = ["newest", "lowest"] if a.side == "both" else [a.side]
    rows = []
    for s in sides:  # an experiment (--pin) gets its own directory and log name, e.g. lowest+transformers==5.1.0
        label = s + "".join(f"+{x}" for x in a.pin)
        rows.append(one_side(label, side_pins(s, a.pin), pytest_args, stamp, a.keep))
    t = table(rows)
    print(t)
    for r in rows:
        for name in r.get("failing", [])[:30]:
            print(f"  {r['side']} failing: {name}")
        if r.get("error"):
            print(f"  {r['side']}: {r['error']}")
    text = f"{stamp}  pytest {' '.join(pytest_args) or '(the whole suite)'}\n\n{t}\n"
    for f in (WORK / "table.md", WORK / "logs" / f"{stamp}-table.md"):  # the latest, and one per run beside its logs
        f.write_text(text, encoding="utf-8")
    ok = all(r.get("rc") == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
