"""The run record and the run directory: one format for finetune, generate, probes and reports.

One concern a module; callers import the module that owns a name:

- ``record``: what a run directory holds (``run.json``: :class:`~.record.RunRecord`, read one way by
  :class:`~.record.RunMeta`; the append-only record logs; ``summary.json``), a probe run's cells, the training
  record a model directory carries (``ropescale_train.json``);
- ``identity``: what the model is (its id, its reference) and the training behind it (its length, its key, the
  longest distance it trained);
- ``locks``: one writer per run directory (an advisory lock on ``.lock``, dropped by the kernel when the process
  dies);
- ``resume``: whose directory a run directory is, ``--resume auto|never`` in every stage, and the one resume check
  (same kind, same settings, same model).
"""
