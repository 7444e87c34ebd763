# The two commands of the README:  make demo  (set-up + end-to-end demo)  and  make test  (set-up + tests).
PY := .venv/bin/python
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test bench clean
setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf .venv .cache runs
