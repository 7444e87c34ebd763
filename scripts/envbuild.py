"""Throw-away virtual environments built from pyproject.toml's ranges: what `make lock` freezes and what `make compat`
tests. The recipe is scripts/setup.sh's ranges mode, step for step:

1. ``python -m venv DIR``;
2. torch (``TORCH``: the CPU wheel, from pip's find-links) alone, first;
3. ``pip install -e .[test,real-model]`` plus any extra pins (e.g. ``transformers==5.0.0``), torch held by a
   constraint;
4. deepspeed (requirements-deepspeed.txt, or a pin) with ``--no-build-isolation`` and DS_BUILD_OPS=0 (its build
   imports torch: an isolated build would download a second, CUDA torch), torch held again;
5. ``pip check``.

Every pip call carries the constraint ``torch==TORCH``, so nothing here can pull another torch. Standard library
only: run it with any Python 3.11+.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"  # the CPU wheel (find-links /opt/wheels); never an unpinned torch
LOCK = ROOT / "requirements.lock"
# installers themselves: in every venv, never pinned (the venv's own pip runs the install)
NOT_LOCKED = ("pip",)
PROJECT = "ropescale"
EXTRAS = ("test", "real-model")  # pyproject's optional groups set-up installs (the lock holds them)


def canon(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[str]:
    """Every requirement string set-up installs with ranges: pyproject's dependencies, its EXTRAS, deepspeed."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = list(meta["dependencies"]) + [r for g in EXTRAS for r in meta["optional-dependencies"][g]]
    out += [ln.split("#")[0].strip() for ln in (ROOT / "requirements-deepspeed.txt").read_text().splitlines()
            if ln.split("#")[0].strip()]
    return out


def lower_bound(name: str) -> str | None:
    """The declared minimum (``>=X``) of ``name`` in :func:`requirements`, or None."""
    for r in requirements():
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", r)
        if m and canon(m.group(1)) == canon(name):
            lo = re.search(r">=\s*([0-9][^,;\s]*)", m.group(2))
            return lo.group(1) if lo else None
    return None


class BuildError(RuntimeError):
    pass


def _run(cmd: list[str], log, env=None) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if r.returncode:
        raise BuildError(f"exit {r.returncode}: {' '.join(cmd)}")


def build(venv: Path, pins: list[str] | tuple = (), *, log, python: str = sys.executable) -> dict[str, str]:
    """A fresh venv at ``venv`` (removed first) installed from the ranges plus ``pins``; returns its versions
    (:func:`installed`). BuildError (the failing command) when pip cannot install or ``pip check`` fails."""
    import shutil

    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    _run([python, "-m", "venv", str(venv)], log)
    py = str(venv / "bin" / "python")
    con = venv / "torch-constraint.txt"
    con.write_text(f"torch=={TORCH}\n")
    pip = [py, "-m", "pip", "--disable-pip-version-check", "install", "-q", "-c", str(con)]
    ds_pins = [p for p in pins if canon(re.split(r"[=<>!~ ]", p)[0]) == "deepspeed"]
    other = [p for p in pins if p not in ds_pins]
    _run(pip + [f"torch=={TORCH}"], log)
    _run(pip + ["-e", f".[{','.join(EXTRAS)}]", *other], log)
    env = dict(os.environ, DS_BUILD_OPS="0")
    ds = ds_pins or ["-r", "requirements-deepspeed.txt"]
    _run(pip + ["--no-build-isolation", *ds, *other], log, env=env)
    _run([py, "-m", "pip", "--disable-pip-version-check", "check"], log)
    # the launcher hook scripts/setup.sh writes into .venv (DS_ACCELERATOR, a quiet Ctrl-C): the suite tests it
    _run([py, "-c", "from ropescale.common.process import write_accelerator_pth as w; w()"], log)
    log.write(f"[envbuild] {venv} built in {time.time() - t0:.0f} s\n")
    return installed(venv)


def installed(venv: Path) -> dict[str, str]:
    """{canonical name: version} of every distribution in ``venv`` (``pip freeze --all``), the editable project and
    :data:`NOT_LOCKED` left out."""
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "list",
                          "--format=freeze", "--exclude-editable"], capture_output=True, text=True, check=True).stdout
    vers = {}
    for ln in out.splitlines():
        if "==" in ln:
            n, v = ln.split("==", 1)
            if canon(n) not in NOT_LOCKED and canon(n) != PROJECT:
                vers[canon(n)] = v.strip()
    return vers


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{canonical name: version} of a lock file (``name==version`` lines; comments and blanks ignored)."""
    out = {}
    if not path.is_file():
        return out
    for ln in path.read_text(encoding="utf-8").splitlines():
        ln = ln.split("#")[0].strip()
        if ln:
            n, v = ln.split("==", 1)
            out[canon(n)] = v.strip()
    return out
