"""The statistics floor (DESIGN.md): every interval and every test a reading uses, one rule per kind, numpy only.
The report stack, the probes and the experiments import the module that owns a name; nothing is re-exported here.

- :mod:`.proportions`: a proportion's interval (Wilson; Clopper-Pearson), never [0, 0] for 0 of n.
"""
