"""common: what every stage shares, each fact in one module.

- ``paths``: where the shared data, the cache and the repository are;
- ``io``: bad input as one ``FILE:LINE`` line (:class:`InputError`), JSONL reading, atomic files and directories;
- ``cli``: the one command-line style (subcommands, ``--out`` / ``--json`` / ``--format``, entry-point set-up);
- ``settings``: a stage's settings as one dataclass -> its flags, its recipe, its run.json, its resume check;
- ``runs``: the run-directory format (run.json, append-only record logs) and its one reader, ``RunMeta``;
- ``tables``: markdown / CSV / JSON tables and the model labels both reports use;
- ``prompts``, ``subsets``: the CNNSum prompt texts and subset presets;
- ``chapters``, ``text``: the shared novels' one reader and sentence splitter.

The stage packages build on it: rope_scaling/ (RoPE methods), data_concat/ (data), training/ (finetune.py),
evaluation/ (eval_summ.py), probes/; ropescale/ is the project's front door (the ``ropescale`` command and the
embedded tiny default). Nothing here imports them.
"""
