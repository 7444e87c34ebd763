"""The statistics floor (DESIGN.md): every interval and every test a reading uses, one rule per kind, numpy only.
The report stack, the probes and the experiments import the module that owns a name; nothing is re-exported here.

- :mod:`.distributions`: the incomplete beta function, Student's t, the binomial tail, the normal quantile;
  ``CONFIDENCE`` (0.95) and ``ALPHA`` (0.05, the q a reading resolves at);
- :mod:`.proportions`: a proportion's interval (Wilson; Clopper-Pearson), never [0, 0] for 0 of n; unit: the trial;
- :mod:`.resampling`: the id x group table a bootstrap resamples, the percentile interval, the analytic variance of
  a combination of means;
- :mod:`.means`: a mean's interval: Student's t at every n (per-sample cells, paired differences, few windows or
  seeds with their range beside it), a cell pooled over seeds by the t quantile over seeds (the two-level bootstrap
  a secondary figure);
- :mod:`.mse`: MSE(P-IE vs P-IB) and its noise floor;
- :mod:`.tests`: the paired sign-flip, the MSE sign-flip, t over seeds, t over windows of buckets within windows
  (the block-aware test); each names its unit and its smallest attainable p;
- :mod:`.multiplicity`: Benjamini-Hochberg q per declared family;
- :mod:`.lengths`: the effective context length (NoLiMa's, RULER's rule) and retention.
"""
