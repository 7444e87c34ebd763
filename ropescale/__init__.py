"""ropescale: the project's own package. Its floor, ``ropescale.common``, holds what every stage shares (files,
settings, run records, prompts, the metric, where a model is); ``training``, ``evaluation`` and ``probes`` are the
stages behind ``finetune.py``, ``eval_summ.py`` and ``ropescale probes``; ``tiny`` builds the embedded tiny default
(``make-tiny``); ``demo`` is the end-to-end demo behind ``scripts/demo.py``; ``cli`` is the front door (the
``ropescale`` command), which only dispatches. ``rope_scaling`` and ``data_concat`` are top-level packages of their
own (the project's card). Importing this package imports nothing else.
"""

__version__ = "0.2.0"  # the project's version (pyproject.toml reads it from here)
