"""common: the floor every stage stands on, each fact in one module; nothing here imports a stage.

- ``paths``: where the repository, the shared data beside it and the cache are;
- ``io``: bad input as one ``FILE:LINE`` line (:class:`~.io.InputError`), JSON / JSONL reading, atomic files and
  directories, output checks;
- ``cli``: the one command-line style (a tool's subcommands registered by reference, ``--out`` / ``--json`` /
  ``--format``, ``--dtype``, the process set-up every entry point runs first);
- ``settings``: a stage's settings as one dataclass -> its flags, its recipe, its run.json, its resume check;
- ``runs``: the run-directory format (run.json and its one reader ``RunMeta``, append-only record logs, a probe
  run's cells), ``open_run_dir``, ``model_id``, the one resume check;
- ``models``: where a model is (``tiny`` = the committed ``assets/tiny``, checked against its sha256; a model
  directory and its weights checked; ``resolve_model``);
- ``tables``: markdown / CSV / JSON tables, their one writer, and the row labels every report uses;
- ``prompts``, ``subsets``: the CNNSum prompt texts and subset presets (``T<tokens>`` read in one place);
- ``rouge`` (+ ``rouge_reference``, the official package run as a reference): CNNSum ROUGE-L and jieba;
- ``recall``: the demo's recall task (its format, sampling and exact-recall scoring);
- ``chapters``, ``text``: the shared novels' one reader and sentence splitter;
- ``compat``: every reliance on another library's internals (a test each in tests/test_compat.py).

The stages build on it: ``rope_scaling/`` (RoPE methods), ``data_concat/`` (data), ``training/`` (finetune.py),
``evaluation/`` (eval_summ.py, and the one report stack both eval_summ and the probes use), ``probes/``; the tiny
default's builder is ``ropescale/tiny/`` (``make-tiny``); ``ropescale/cli.py`` is the front door.
"""
