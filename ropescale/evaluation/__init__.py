"""Evaluation internals behind eval_summ.py.

- ``generate``: ``GenerateSettings`` (the RoPE spec and the backend's ``BackendSettings`` nested) and the command;
  ``backends`` / ``engine``: the hf (slot decoder) and vllm backends; ``data``: reading CNNSum-format data.
- ``score``: CNNSum ROUGE-L (``rouge``) of a run or file, failure modes (``failure_modes``).
- ``report/``: the paper's tables (intake, model, render, cli) on ``ropescale.common.tables``; ``plot``: Fig. 3.
- ``run_all``: generate + score + report in one command.
"""
