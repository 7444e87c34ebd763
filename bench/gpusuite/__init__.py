"""The modules of ``bench/gpu_suite.py``: ``plan`` (the steps, the sets ``--only`` takes, expected seconds),
``runner`` (the record, the subprocesses, reading their output), ``table`` (the report) and ``steps`` (the suite's
own env and prepare steps)."""
