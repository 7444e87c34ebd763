#!/usr/bin/env bash
# Set up ropescale's virtual environment at .venv/ (project root). Idempotent: a finished set-up is reused.
#  - torch: if the venv (or, with ROPESCALE_SYSTEM_TORCH=1, the base python) already has a torch, it is kept
#    (e.g. a CUDA build on a GPU box); otherwise torch==2.13.0 is installed (the CPU wheel on this machine's disk).
#    A bare `pip install torch` would pull a multi-GB CUDA build on a CPU machine: never done here.
#  - the dependencies are listed once, in pyproject.toml: requirements.txt installs the package itself editable
#    (`pip install -e .[test]`), which puts the `ropescale` command in .venv/bin and never touches torch.
#  - deepspeed is installed with --no-build-isolation so its build uses that torch instead of downloading one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
stamp=$VENV/.ropescale-setup-ok
req_hash=$(cat pyproject.toml requirements.txt requirements-deepspeed.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req_hash" ]; then
  echo "[setup] .venv is up to date" >&2; exit 0
fi
if [ ! -x $VENV/bin/python ]; then
  if [ "${ROPESCALE_SYSTEM_TORCH:-0}" = 1 ] && $PY -c "import torch" 2>/dev/null; then
    echo "[setup] creating .venv with the base python's torch ($($PY -c 'import torch; print(torch.__version__)'))" >&2
    $PY -m venv --system-site-packages $VENV
  else
    echo "[setup] creating .venv with $($PY --version)" >&2
    $PY -m venv $VENV
  fi
fi
pip() { $VENV/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
if $VENV/bin/python -c "import torch" 2>/dev/null; then
  echo "[setup] keeping torch $($VENV/bin/python -c 'import torch; print(torch.__version__)')" >&2
else
  echo "[setup] installing torch==2.13.0 (CPU wheel)" >&2
  pip install "torch==2.13.0"
fi
echo "[setup] installing requirements.txt (the package, editable, and its dependencies from pyproject.toml)" >&2
pip install -r requirements.txt
echo "[setup] installing deepspeed (no build isolation, ops JIT-only)" >&2
DS_BUILD_OPS=0 pip install --no-build-isolation -r requirements-deepspeed.txt
$VENV/bin/python -c "import torch, transformers, peft, deepspeed, jieba" >/dev/null 2>&1 \
  || { echo "[setup] import check failed" >&2; $VENV/bin/python -c "import torch, transformers, peft, deepspeed, jieba"; exit 1; }
[ -x $VENV/bin/ropescale ] || { echo "[setup] the ropescale command is missing from $VENV/bin" >&2; exit 1; }
echo "$req_hash" > "$stamp"
echo "[setup] done: $($VENV/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')" >&2
