"""Evaluation internals behind eval_summ.py.

- ``generate``: ``GenerateSettings`` (the RoPE spec and the backend's ``BackendSettings`` nested) and the command;
  ``backends/`` (the interface, the registry, one module per backend: hf, vllm) / ``engine`` (the hf backend's slot
  decoder); ``data``: reading CNNSum-format data.
- ``score``: CNNSum ROUGE-L (``rouge``) of a run or file, failure modes (``failure_modes``).
- ``report/``: the one report stack, for eval_summ and the probes: ``intake`` (scores CSV, generation and probe
  runs), ``model`` (the paper's formulas), ``render`` (the paper's views), ``probes`` (the probes' tables), ``plot``
  (Fig. 3, the probes' panels, one PNG writer), ``cli`` (both report commands), on ``ropescale.common.tables``.
- ``run_all``: generate + score + report in one command.
"""
