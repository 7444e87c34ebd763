"""The lock and set-up: requirements.lock pins every package exactly and fits pyproject.toml's ranges; .venv holds
exactly the lock; scripts/setup.sh installs from the lock (torch first, deepspeed without build isolation, the
project with --no-deps, pip check), re-runs when the lock changes, and keeps the ranges with
ROPESCALE_SYSTEM_TORCH=1; the lock and compat scripts' own logic."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import compat as compat_script  # noqa: E402  (scripts/compat.py)
import envbuild  # noqa: E402
import lock as lock_script  # noqa: E402

LOCK = ROOT / "requirements.lock"


def lock_lines() -> list[str]:
    return [ln for ln in LOCK.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_lock_pins_every_package_exactly_and_torch_to_the_cpu_wheel():
    lines = lock_lines()
    bad = [ln for ln in lines if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*", ln)]
    assert not bad, f"not an exact pin: {bad}"
    names = [envbuild.canon(ln.split("==")[0]) for ln in lines]
    assert len(names) == len(set(names)), "a package is pinned twice"
    lock = envbuild.read_lock()
    assert lock["torch"] == f"{envbuild.TORCH}+cpu" == "2.13.0+cpu"
    assert "pip" not in lock and "ropescale" not in lock
    assert not [n for n in lock if n.startswith("nvidia-")], "a CUDA package in the lock"


def test_the_lock_fits_the_ranges_it_came_from():
    """Every requirement of pyproject.toml (with the test extra) and requirements-deepspeed.txt is locked at a
    version its range allows: a range changed without `make lock` fails here."""
    lock = envbuild.read_lock()
    reqs = [Requirement(r) for r in envbuild.requirements()]
    assert {"transformers", "peft", "accelerate", "datasets", "deepspeed"} <= {envbuild.canon(r.name) for r in reqs}
    for r in reqs:
        v = lock.get(envbuild.canon(r.name))
        assert v is not None, f"{r.name} is not in requirements.lock: run make lock"
        assert r.specifier.contains(v, prereleases=True), f"requirements.lock has {r.name}=={v}, outside {r}"


def _venv_distributions() -> dict[str, str]:
    site = list((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    assert site, "no .venv: run make setup"
    return {envbuild.canon(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(site[0])])}


def test_venv_holds_exactly_the_lock():
    """.venv (whatever Python runs this test) as set-up left it: in lock mode every distribution is the lock's, at
    its version, and nothing else (pip and the project aside); in ROPESCALE_SYSTEM_TORCH=1 mode (ranges) every
    requirement is met."""
    mode_file = ROOT / ".venv" / ".ropescale-setup-mode"
    assert mode_file.is_file(), "no .venv set up by scripts/setup.sh: run make setup"
    have = _venv_distributions()
    have.pop("pip", None)
    assert have.pop("ropescale", None) is not None, "the project is not installed in .venv"
    if mode_file.read_text().strip() == "ranges":
        for r in map(Requirement, envbuild.requirements()):
            assert r.specifier.contains(have.get(envbuild.canon(r.name), "0"), prereleases=True), r
        return
    lock = envbuild.read_lock()
    if have.get("torch") != lock["torch"]:  # a torch of your own in .venv is kept by set-up
        have.pop("torch", None)
        lock.pop("torch")
    diff = lock_script.diff(lock, have)
    assert not diff, f".venv differs from requirements.lock (make setup; make clean setup): {diff}"


# ---------------------------------------------------------------- scripts/setup.sh, with a pip that only records
FAKE_PYTHON = r"""#!/usr/bin/env bash
# records every call; plays a venv python without torch
echo "CALL DS_BUILD_OPS=${DS_BUILD_OPS:-} $*" >> "$FAKE_LOG"
prev=""
for a in "$@"; do
  if [ "$prev" = "-r" ]; then echo "FILE $a: $(grep -v '^#' "$a" | tr '\n' ' ')" >> "$FAKE_LOG"; fi
  prev="$a"
done
case "$*" in
  *"import torch; print(torch.__version__)") [ -n "${FAKE_TORCH:-}" ] && echo "$FAKE_TORCH" && exit 0; exit 1;;
  *"sys.version_info"*) echo 3.11;;
  *"pip --disable-pip-version-check list"*) grep -v '^#' "$FAKE_LOCK"; echo "pip==23.2.1";;
esac
exit 0
"""


def _setup_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for f in ("pyproject.toml", "requirements.txt", "requirements-deepspeed.txt", "requirements.lock",
              "scripts/setup.sh"):
        shutil.copy(ROOT / f, repo / f)
    bin_ = repo / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "python").chmod(0o755)
    (bin_ / "ropescale").write_text("")
    (bin_ / "ropescale").chmod(0o755)
    return repo


def _run_setup(repo: Path, log: Path, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, FAKE_LOG=str(log), FAKE_LOCK=str(repo / "requirements.lock"), **env)
    e.pop("ROPESCALE_SYSTEM_TORCH", None)
    e.update(env)
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], cwd=repo, env=e, capture_output=True,
                          text=True, timeout=60)


def _installs(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if " install " in ln or ln.startswith("FILE")]


def test_setup_installs_the_lock_torch_first_then_deepspeed_then_the_project(tmp_path):
    repo = _setup_copy(tmp_path)
    log = tmp_path / "calls.log"
    r = _run_setup(repo, log)
    assert r.returncode == 0, r.stderr
    lock = envbuild.read_lock()
    steps = _installs(log)
    assert len(steps) == 5, steps  # rest (+ its file), deepspeed (+ its file), the project
    rest, rest_file, ds, ds_file, project = steps
    assert "--no-deps -r" in rest and "--no-build-isolation" not in rest
    pins = rest_file.split(": ", 1)[1].split()
    assert f"torch=={lock['torch']}" in pins and not any(p.startswith("deepspeed==") for p in pins)
    assert len(pins) == len(lock) - 1
    assert "DS_BUILD_OPS=0 " in ds and "--no-deps" in ds and "--no-build-isolation" in ds
    assert ds_file.split(": ", 1)[1].split() == [f"deepspeed=={lock['deepspeed']}"]
    assert re.search(r"install --no-deps( --no-build-isolation)? -e \.$", project), project
    calls = log.read_text()
    assert calls.index("--no-deps -r") < calls.index("--no-build-isolation -r") < calls.index("-e .") \
        < calls.index("pip --disable-pip-version-check check")
    assert (repo / ".venv" / ".ropescale-setup-mode").read_text().strip() == "lock"
    # done: a second run does nothing; a changed lock makes it run again
    log.unlink()
    r = _run_setup(repo, log)
    # (it installs nothing; the venv's .pth is rewritten by the package's own call, however old the venv)
    assert "up to date" in r.stderr and (not log.exists() or not _installs(log))
    with open(repo / "requirements.lock", "a") as f:
        f.write("# touched\n")
    r = _run_setup(repo, log)
    assert r.returncode == 0 and len(_installs(log)) == 5, r.stderr


def test_setup_keeps_a_torch_of_your_own_and_the_ranges_with_system_torch(tmp_path):
    repo = _setup_copy(tmp_path)
    log = tmp_path / "calls.log"
    r = _run_setup(repo, log, FAKE_TORCH="2.9.0+cu128")
    assert r.returncode == 0, r.stderr
    assert "keeping torch 2.9.0+cu128" in r.stderr
    rest_file = _installs(log)[1]
    assert not re.search(r"\btorch==", rest_file) and "transformers==" in rest_file
    log.unlink()
    r = _run_setup(repo, log, ROPESCALE_SYSTEM_TORCH="1", FAKE_TORCH="2.9.0+cu128")
    assert r.returncode == 0, r.stderr
    calls = log.read_text()
    assert "requirements.lock" not in calls and "--no-deps" not in calls
    assert "install -r requirements.txt" in calls and "--no-build-isolation -r requirements-deepspeed.txt" in calls
    assert "torch==" not in calls  # the user's torch is kept
    assert (repo / ".venv" / ".ropescale-setup-mode").read_text().strip() == "ranges"


# ---------------------------------------------------------------- scripts/lock.py, scripts/compat.py
def test_lock_diff_names_each_kind_of_change():
    old = {"a": "1.0", "b": "0.9.0", "c": "2.0", "d": "5.1"}
    new = {"a": "1.0", "b": "0.10.0", "c": "1.9.9", "e": "3"}
    assert lock_script.diff(old, new) == ["^ b 0.9.0 -> 0.10.0  (upgraded)", "v c 2.0 -> 1.9.9  (downgraded)",
                                          "- d==5.1  (removed)", "+ e==3  (added)"]
    assert lock_script.diff(new, new) == []


def test_a_rendered_lock_reads_back(tmp_path):
    vers = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "pyyaml": "6.0.4"}
    p = tmp_path / "requirements.lock"
    p.write_text(lock_script.render(vers, "2026-11-25"))
    assert envbuild.read_lock(p) == vers
    text = p.read_text()
    assert "on 2026-11-25 with CPython 3." in text and text.index("pyyaml==") < text.index("torch==")


def test_compat_lowest_side_pins_the_declared_minimums():
    pins = compat_script.side_pins("lowest", [])
    want = {n: envbuild.lower_bound(n) for n in compat_script.LOWEST}
    assert all(want.values()) and sorted(pins) == sorted(f"{n}=={v}" for n, v in want.items())
    assert compat_script.side_pins("newest", []) == []
    over = compat_script.side_pins("lowest", ["deepspeed==0.18.0"])
    assert "deepspeed==0.18.0" in over and len(over) == 5
