"""Evaluation internals behind eval_summ.py: generation, CNNSum ROUGE-L, reports, failure modes, plots."""
