"""training: finetune.py's internals (CNNSum Sec 5 / Appendix B.2).

- ``env``: process set-up before torch/DeepSpeed (CPU accelerator + gloo, single-process rendezvous defaults).
- ``config``: ``TrainSettings``, every setting of a run (its flag, recipe key, check and resume rule; the RoPE spec
  nested): the CLI, recipes (YAML), run.json and ``--resume`` are built from it.
- ``data``: packed samples (data_concat format), the tiny model's default data, length checks, batching.
- ``model``: the model under its RoPE setting (``rope_scaling.load``), LoRA + trainable embeddings/norms.
- ``loss``: the label-only loss (LM head only at labelled positions).
- ``trainer``: HF Trainer subclass + progress / export callbacks.
- ``saving``: ZeRO-aware export of what was trained, merge into a full model.
- ``run``: one run top to bottom; ``cli``: the command line.
"""
