"""Experiments: a study is one file (``experiments/*.yaml``, docs/experiments.md). ``python -m ropescale.experiments
run|report FILE``.

- ``spec``: the file format, read and checked (:func:`spec.load`);
- ``runner``: the settings (:class:`runner.ExperimentSettings`) and the runs, each arm x seed x length an in-process
  call of a ``ropescale`` command with ``--out`` its run directory and ``--resume auto``;
- ``collect``: the runs' per-sample scores;
- ``compare``: cells, paired tests and BH q per family, by the statistics floor (``ropescale/common/stats``);
- ``page``: the markdown page, its reading section kept across re-runs.
"""
