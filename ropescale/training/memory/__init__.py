"""Where a training step's tensors live: the memory of a step, estimated, planned and installed on the model.

- ``estimate``: the estimated peak memory of a step per GPU (a model, not a measurement), the model shape and the
  step's set-up it reads, the activation part of a plan (``Activations``); ``python -m
  ropescale.training.memory.estimate --table | --check``.
- ``plan``: the memory planner (which plan fits the device and the host, fastest by its time model) and a finetune
  run's plan (``--memory-plan``), the DeepSpeed config as the plan needs it.
- ``reach``: the longest sample each family of plans fits; ``python -m ropescale.training.memory --plan N |
  --reach`` (``__main__``) prints a plan or the reach.
- ``install``: a plan applied to the trained model (``setup_memory``): recompute, checkpoints on the device or the
  host, the tiled MLP, layers tiled by sequence.
- ``offload``: checkpoints in pinned host memory, copied on a side stream, and the host-RAM check.
- ``tiled_mlp``: each layer's MLP over sequence chunks (ALST's TiledMLP), the replay of a forward's autocast and RNG
  the recomputing paths share; ``tiled_attention``: a recomputed layer by sequence chunks (``--tile-attention``).
"""
