"""probes: does a (RoPE-scaled) model *use* its long context? Log-likelihood probes from three papers.

- ``suffix-id``: suffix identification, ChapterBreak (Sun, Thai & Iyyer 2022, Sec 2) and the sentence variant of
  Sun et al. 2021 (Sec 5);
- ``ppl``: target loss vs prefix length (Sun et al. 2021, Sec 3);
- ``perturb``: target loss change when only the distant prefix is perturbed (Sun et al. 2021, Sec 4);
- ``copy``: target span pasted into the prefix at a distance (Sun et al. 2021, Sec 5);
- ``shuffle``: the zero-shot k-Block Shuffle Test (Laban et al. 2021, Sec 3-4);
- ``ruler``: RULER's synthetic tasks (Hsieh et al. 2024: needles single / multikey / multivalue / multiquery,
  variable tracking, common and frequent words) and the needle depth x length grid, scored teacher-forced and by
  generation (RULER's string_match_all), with RULER's and NoLiMa's effective lengths (ropescale.probes.ruler);
- ``passkey``: the passkey retrieval of the YaRN / LongRoPE papers (Mohtashami & Jaggi 2023), single key in the
  noise haystack by default or several named keys, read by key distance against its references;
- ``position-loss``: the next-token loss by position over held-out windows, per bucket (one forward a window);
- ``continuation``: greedy continuations against the text's own and on a name-swapped copy (memorisation;
  Carlini et al. 2023, Def. 3.1);
- ``report``: the extrapolation table (rows = model x rope x scale, columns = length bucket) and a PNG, made by the
  one report stack (``ropescale.evaluation.report``: ``probes.py`` its tables, ``cli.py`` the command).

The log-likelihood probes score by batched teacher forcing (ropescale.probes.scorer), no generation; ``ruler`` and
``continuation`` also generate (greedy). Each probe writes a run
directory (run.json, items.jsonl, summary.json) of the same shape as generation's (ropescale.common.runs).
"""
