"""The run record and the run directory: one format for finetune, generate, probes and reports.

A run directory holds:
- ``run.json``: the run's record (:class:`RunRecord`), written atomically, with the same field names in every
  stage: ``kind`` ("finetune", "generate", "probe"), ``model`` (the model directory used: ``tiny`` for the
  embedded default, else its absolute path), ``model_id`` (:func:`model_id`: what the model *is*, so a model
  replaced at the same path is noticed), ``rope`` (the full RoPE spec the model ran with, read back with
  ``rope_scaling.RopeSpec.from_record``), ``context`` (the RoPE-extended context), ``train`` (the training record
  of the model: :func:`read_train_record`; for a finetune run the record of the training it does), ``data`` (the
  data read), ``settings`` (the stage's settings as resolved, flat as in a recipe:
  ``ropescale.common.settings.to_record``, without model, data and rope, which are above), ``info`` (what the
  stage adds: counts, data stats, the probe's name...), ``status``, ``seconds`` (wall time of the whole run,
  summed over its parts when resumed), ``created``, ``updated``, ``versions``. :class:`RunMeta` is the one
  reader, older layouts included (flat settings at the top level, ``args``, ``model_dir`` / ``model_path``,
  ``extended_context``, an integer ``train_length``).
- one or more append-only JSONL record files (``predictions.jsonl`` for generation, ``items.jsonl`` for probes):
  one JSON object a line, each with a unique ``id``. A record is appended with one ``write`` + ``fsync``, so a
  kill -9 loses at most the record in flight; a torn last line is cut off when the log is reopened. Resuming
  skips ids already present and never duplicates one.
- ``summary.json`` / ``scores.json``: derived numbers, written atomically.

A directory holding a run record belongs to that run (:func:`claim_run_dir`): a run of another kind is never written
into it, and a run of the same kind continues it only with the same settings (:func:`check_resume`, the one resume check
every stage calls) and the same model (:func:`model_id`). ``--resume`` says the same in every stage that writes a run
directory (:data:`RESUME_HELP`, :func:`check_resume_mode`): ``auto`` continues the run --out holds or starts one where
there is none, ``never`` starts only a new run; without the flag generate, run and the probes continue (auto), a
fine-tune and a factor search refuse (never: they say how to continue). One process writes it at a time: the writer
holds an advisory lock on ``.lock`` in it (:func:`lock_run_dir`, taken by :func:`open_run_dir`; the kernel drops it when
the process dies, however it dies), and a second writer is refused naming the holder's pid.

A model directory made by ``finetune.py merge`` carries its training record in ``ropescale_train.json``
(:data:`TRAIN_JSON`): the run's id, the checkpoint step, the RoPE spec, the data and its length (mean, min, max:
the paper's "Train Len." is the mean), the steps, the base model and its id. Every run that reads the model
records it as ``train``.

One concern a module: ``record`` (run.json, the record logs, the run directory, a probe run's cells, a model's
training record), ``identity`` (what the model is: its id, its training length), ``locks`` (one writer per run
directory), ``resume`` (whose directory, ``--resume``, the one resume check). Every name is importable from here.
"""
from .identity import (  # noqa: F401
    TRAIN_JSON,
    TrainLength,
    length_of,
    model_id,
    model_ref,
    train_key,
    trained_distance,
)
from .locks import (  # noqa: F401
    LOCK_FILE,
    lock_run_dir,
    release_run_dirs,
    run_dir_holder,
    run_dir_scope,
)
from .record import (  # noqa: F401
    ITEMS,
    RECORD_FIELDS,
    RUN_JSON,
    SUMMARY,
    RecordLog,
    RunDir,
    RunMeta,
    RunRecord,
    column_key,
    find_run_dirs,
    now,
    read_train_record,
    settings_record,
    summarize,
    versions,
)
from .resume import (  # noqa: F401
    RESUME_HELP,
    RESUME_MODES,
    check_resume,
    check_resume_mode,
    claim_run_dir,
    open_run_dir,
    recorded_keys,
    refuse_resume,
    resume_diffs,
    settings_diff,
)
