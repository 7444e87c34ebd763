#!/usr/bin/env bash
# README command (1), run by `make demo` after set-up: the end-to-end demo on a CPU (see scripts/demo.py --help).
# Takes the committed tiny default, packs recall pairs, fine-tunes it with each of none / PI / NTK / YaRN at x8
# (DeepSpeed), samples eval sets at 1x-8x the original context, generates with both prompts, scores, prints the
# extrapolation table and writes the Fig. 3 PNG. Outputs under runs/demo/ (fine-tuning runs in
# runs/demo/train/tiny-<method>[-x8]/). Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec .venv/bin/python scripts/demo.py "$@"
