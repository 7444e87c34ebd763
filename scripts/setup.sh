#!/usr/bin/env bash
# Set up ropescale's virtual environment at .venv/ (project root). Idempotent: a finished set-up is reused (a stamp
# hashes this script, requirements.lock, pyproject.toml, the requirements files and the mode).
#
# Default (make demo, make test, .ci/run): the LOCK. Every package comes from requirements.lock at its exact version,
# so two fresh set-ups on different days give the same environment. Installed with --no-deps, in this order:
#   1. every pin except deepspeed (torch==2.13.0+cpu among them: the CPU wheel on this machine's disk, pip's
#      find-links; a bare `pip install torch` would pull a multi-GB CUDA build on a CPU machine: never done here);
#   2. deepspeed, with --no-build-isolation and DS_BUILD_OPS=0 (its build imports the torch of step 1; an isolated
#      build would download another one);
#   3. the project itself, editable (`pip install --no-deps -e .`: the `ropescale` command in .venv/bin);
#   4. `pip check`.
#   A torch already in .venv that differs from the lock's (one you put there, e.g. a CUDA build) is kept, with a
#   note; packages in .venv that the lock does not list are named, not removed (`make clean setup` for an exact one).
#   `make lock` regenerates the lock from pyproject.toml's ranges; `make compat` tests both ends of the ranges.
#
# ROPESCALE_SYSTEM_TORCH=1 (your own GPU environment): the RANGES, not the lock. .venv sees the base Python's
#   packages (--system-site-packages) and keeps its torch (e.g. a CUDA build; torch==2.13.0 only if it has none);
#   the dependencies come from pyproject.toml's tested ranges (requirements.txt: `pip install -e .[test,real-model]`) and
#   requirements-deepspeed.txt, so pip keeps what already fits and the lock forces no torch or CUDA-specific
#   package on you. The same as `pip install -e .` into an environment of your own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
LOCK=requirements.lock
MODE=lock
[ "${ROPESCALE_SYSTEM_TORCH:-0}" = 1 ] && MODE=ranges
stamp=$VENV/.ropescale-setup-ok
req_hash=$( (cat pyproject.toml requirements.txt requirements-deepspeed.txt $LOCK scripts/setup.sh; echo "$MODE") \
  | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req_hash" ]; then
  # the venv's .pth (DS_ACCELERATOR, the launcher's Ctrl-C) is the package's: rewritten however old the venv
  $VENV/bin/python -c "from ropescale.common.process import write_accelerator_pth as w; w()"
  echo "[setup] .venv is up to date" >&2; exit 0
fi
[ -f $LOCK ] || { echo "[setup] $LOCK is missing (make lock writes it)" >&2; exit 1; }
if [ ! -x $VENV/bin/python ]; then
  if [ $MODE = ranges ] && $PY -c "import torch" 2>/dev/null; then
    echo "[setup] creating .venv with the base python's torch ($($PY -c 'import torch; print(torch.__version__)'))" >&2
    $PY -m venv --system-site-packages $VENV
  else
    echo "[setup] creating .venv with $($PY --version)" >&2
    $PY -m venv $VENV
  fi
fi
pip() { $VENV/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
have_torch=$($VENV/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
lock_torch=$(sed -n 's/^torch==//p' $LOCK)
if [ $MODE = lock ]; then
  lock_py=$(sed -n 's/^# .* with CPython \([0-9]*\.[0-9]*\).*/\1/p' $LOCK | head -1)
  venv_py=$($VENV/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$lock_py" = "$venv_py" ] || echo "[setup] note: $LOCK was made with Python $lock_py, .venv has $venv_py" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  skip='^deepspeed=='
  if [ -n "$have_torch" ] && [ "$have_torch" != "$lock_torch" ]; then
    echo "[setup] keeping torch $have_torch in .venv (the lock has $lock_torch)" >&2
    skip='^(deepspeed|torch)=='
  fi
  grep -vE "$skip" $LOCK > "$tmp/rest.txt"
  grep -E '^deepspeed==' $LOCK > "$tmp/deepspeed.txt"
  echo "[setup] installing $LOCK ($(grep -cE '^[^#]' $LOCK) exact pins, --no-deps)" >&2
  pip install --no-deps -r "$tmp/rest.txt"
  echo "[setup] installing $(cat "$tmp/deepspeed.txt") (no build isolation, ops JIT-only)" >&2
  DS_BUILD_OPS=0 pip install --no-deps --no-build-isolation -r "$tmp/deepspeed.txt"
  echo "[setup] installing the package itself (editable)" >&2
  pip install --no-deps --no-build-isolation -e .
  extra=$($VENV/bin/python -m pip --disable-pip-version-check list --format=freeze --exclude-editable 2>/dev/null \
    | sed 's/==.*//' | tr 'A-Z_.' 'a-z--' | sort | comm -23 - <(sed -n 's/==.*//p' $LOCK | tr 'A-Z_.' 'a-z--' | sort) \
    | grep -vx pip || true)
  [ -z "$extra" ] || echo "[setup] note: in .venv but not in $LOCK (left installed): $(echo $extra)" >&2
else
  if [ -n "$have_torch" ]; then
    echo "[setup] keeping torch $have_torch" >&2
  else
    echo "[setup] installing torch==$lock_torch (no torch in the base python)" >&2
    pip install "torch==$lock_torch"
  fi
  echo "[setup] installing requirements.txt (the package, editable, and pyproject.toml's ranges)" >&2
  pip install -r requirements.txt
  echo "[setup] installing requirements-deepspeed.txt (no build isolation, ops JIT-only)" >&2
  DS_BUILD_OPS=0 pip install --no-build-isolation -r requirements-deepspeed.txt
fi
check=$($VENV/bin/python -m pip --disable-pip-version-check check 2>&1) \
  || { echo "$check" >&2; echo "[setup] pip check failed" >&2; exit 1; }
$VENV/bin/python -c "import torch, transformers, peft, deepspeed, jieba" >/dev/null 2>&1 \
  || { echo "[setup] import check failed" >&2; $VENV/bin/python -c "import torch, transformers, peft, deepspeed, jieba"; exit 1; }
[ -x $VENV/bin/ropescale ] || { echo "[setup] the ropescale command is missing from $VENV/bin" >&2; exit 1; }
# DS_ACCELERATOR=cpu at start-up on a machine without a GPU: `deepspeed ... --json` stdout stays JSON (common/process.py)
$VENV/bin/python -c "from ropescale.common.process import write_accelerator_pth as w; w()"
echo "$MODE" > $VENV/.ropescale-setup-mode
echo "$req_hash" > "$stamp"
echo "[setup] done ($MODE): $($VENV/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')" >&2
