"""training: finetune.py's internals (CNNSum Sec 5 / Appendix B.2).

- ``cli``: the command line (``train``, the default, and ``merge``); ``run``: one run top to bottom, in seven
  named phases (settings, data, trainer arguments, model, run record, trainer, fit and export).
- ``config``: ``TrainSettings``, every setting of a run (its flag, recipe key, check and resume rule; the RoPE spec
  nested): the CLI, recipes (YAML), run.json and ``--resume`` are built from it; the DeepSpeed config files.
- ``data``: packed samples (data_concat format), the default data built for a model, length checks, batching;
  ``positions``: which positions and attention a packed sample gets (the packing ``Policy``, PoSE, the coverage).
- ``model``: the model under its RoPE setting (``rope_scaling.load``), LoRA + trainable embeddings/norms, the causal
  LM inside a PEFT / DeepSpeed wrapper.
- ``loss``: the label-only loss (LM head only at labelled positions).
- ``trainer``: HF Trainer subclass + progress / export callbacks.
- ``saving``: ZeRO-aware export of what was trained, merge into a full model.
- ``memory`` (a package): where a step's tensors live: the memory model, the planner, checkpoint offload to host
  memory, the tiled MLP and attention, the host-RAM check.
- ``attn_pick``: the attention kernel a run uses (measured on CUDA); ``curves``: the loss-and-learning-rate PNG.
- ``sequence_parallel``: one sample split over K processes (DeepSpeed Ulysses).
"""
