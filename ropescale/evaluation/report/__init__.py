"""``eval_summ.py report``: the paper's tables from scores — Table 2 / Table 7 views, extrapolation, failure modes.

Inputs (any mix):
- ``--scores FILE.csv`` with columns ``model,prompt,subset,rouge_l`` (prompt IE or IB — ie/ib/ft-ie/ft-ib/
  Prompt-IE are accepted too; subset L, XL, 2XL, 3XL or any name such as T2048; a ``-`` or empty rouge_l is a
  missing cell) and optional ``rope,scale,train_length,longrope_factors`` columns (``longrope_factors``: a LongRoPE
  factor file, relative to the CSV, needed by ``rope`` longrope; the row is labelled by the factors' content hash);
- run directories written by ``eval_summ.py generate`` (a folder is searched for them), scored on the fly when
  their ``scores.json`` is missing or stale (and the scores saved into them, unless ``--no-save-scores``).

Views:
- Table 2 (CNNSum Table 2): per model and subset the average of the Prompt-IE and Prompt-IB scores, and
  ``MSE(P-IE vs P-IB)`` = the mean over the model's subsets of (IE - IB)^2. A subset scored with only one of the
  prompts shows no average (``-``) and leaves the model without an MSE: one prompt's score is not the average.
- Table 7 (CNNSum Appendix C): IE and IB side by side.
- Extrapolation (CNNSum Table 8): rows = settings (model, RoPE spec, training length: the mean with the range),
  columns = subsets or ``--buckets`` of input length (from each sample's ``input_tokens``), cells = ROUGE-L (the
  mean over the prompts present of each prompt's mean over samples).
- Failure modes (CNNSum Sec 4.4): per run, the share of empty / copied / repetitive / prompt-echoing outputs.
- Recall (the demo's recall task, ``ropescale.common.recall``; only for runs whose references are in its format):
  exact recall per mark (which of the K marked sentences came back verbatim under its mark, i.e. by depth in the
  context) x100, their mean and ROUGE-L, per setting and eval length, with a floor row: a prediction of the marks
  alone.

A row is one full setting: the model (and its id), the full RoPE spec, its training record (fine-tuned, with its
mean training length, or the method applied at load time) and the prompt wording; runs are pooled into a row only
when all of these are equal, and every view uses the same rows. A row's label shows what differs between the rows
shown (``tiny · abf x1 base=8e4`` vs ``tiny · abf x1 base=5e5``, ``yarn x8 (ft 1536)`` vs ``yarn x8 (no
fine-tune)``).
Importable, each from its home: ``cli.make_report`` (the whole command as one call), ``intake.build_report``
(paths and/or rows -> ``model.Report``), ``render.render``, ``render.write_report``, ``cli.plot_report``. Inside:
``intake`` (CSV files, generation and probe run directories), ``model`` (series, cells, the paper's formulas),
``render`` (the views as tables), ``probes`` (the probes' tables: ``ropescale probes report``), ``plot`` (Fig. 3,
the probes' panels, one PNG writer), ``cli`` (both commands). Importing the package imports none of them.
"""
