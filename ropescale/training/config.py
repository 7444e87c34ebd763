"""Training settings: one dataclass, :class:`TrainSettings` (the RoPE spec nested), and what is built from it.

Its fields are the flags of ``finetune.py`` (help, defaults, checks), the keys of a recipe, the ``settings``
record of run.json and what ``--resume`` compares (``ropescale.common.settings``). Precedence: built-in defaults <
recipe (``--recipe FILE``; for the tiny default model without a recipe, ``recipes/tiny_demo.yaml``) < flags given on
the command line. A recipe key that is not a setting, or a value of the wrong type or out of range, is an error naming
the file and line; the resolved settings are checked again (naming the flag) before any work.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from rope_scaling import RopeSpec
from ropescale.common.cli import DTYPES, dtype_name
from ropescale.common.io import InputError
from ropescale.common.models import MODEL_HELP
from ropescale.common.paths import DS_CONFIGS_DIR, RECIPES_DIR
from ropescale.common.settings import add_settings, from_args, given, nested, read_recipe, setting

from .curves import REPORT_TO
from .positions import ATTENTIONS, DEFAULT_ATTENTION, DEFAULT_POSE_CHUNKS, DEFAULT_POSITIONS, POSITIONS

TINY_DEMO_RECIPE = RECIPES_DIR / "tiny_demo.yaml"


def _at_least(n):
    return (lambda v: v >= n, f">= {n}")


def _positive():
    return (lambda v: v > 0, "> 0")


DATA, LORA, OPTIM, HOW = ("what to train on", "advanced: LoRA and what else is trained",
                          "advanced: optimization (CNNSum Appendix B.2)", "advanced: how it runs")
PACK = "advanced: positions in a packed sample (docs/positions.md)"


@dataclass(frozen=True)
class TrainSettings:
    """Every setting of a fine-tuning run (see module doc)."""

    # what to train on
    model: str = setting("tiny", MODEL_HELP, resume="path", group=DATA)
    data: str | None = setting(None, "packed dataset directory (python -m data_concat pack); default: one built from "
                                     "the shared novels and cached, sized for the model (tiny default only)",
                               resume="path", group=DATA)
    out: str | None = setting(None, "run directory; default: runs/train/<model>-<rope>-x<scale>",
                              aliases=("--output-dir",), resume="ignore", group=DATA)
    init_from: str | None = setting(None, "start from the adapter + trained tensors of another finetune run (e.g. "
                                          "the 16K run for a 32K continuation)", resume="path", group=DATA)
    init_step: int | None = setting(None, "with --init-from: that run's checkpoint of this step; default: its final "
                                          "export", check=_at_least(0), group=DATA)
    allow_extrapolation: bool = setting(False, "allow samples longer than the RoPE-extended context (e.g. Yi-6B "
                                               "trained at 16K without scaling, Table 8)", group=PACK)
    positions: str = setting(DEFAULT_POSITIONS, "position ids of a packed sample: continuous (0 .. n-1 over the "
                             "sample, CNNSum Sec 5) or reset (each pair from 0; needs --attention document): "
                             "ropescale/training/positions.py", choices=POSITIONS, group=PACK)
    attention: str = setting(DEFAULT_ATTENTION, "attention in a packed sample: causal (across its pairs, the paper's) "
                             "or document (each pair attends only to itself)", choices=ATTENTIONS, group=PACK)
    pose_target: int | None = setting(None, "PoSE (Zhu et al. 2024): position ids of each sample (or pair, with "
                                            "reset) split into chunks offset by random skips so they reach up to "
                                            "this many tokens; default: off", check=_at_least(1), group=PACK)
    pose_chunks: int = setting(DEFAULT_POSE_CHUNKS, "PoSE: chunks per span (the paper's N = 2)", check=_at_least(1),
                               group=PACK)
    rope: RopeSpec = nested(RopeSpec, resume="ignore")  # resume compares the rope the model trains with
    # LoRA and what else is trained
    lora_r: int = setting(8, "LoRA rank (Sec 5)", check=_at_least(1), group=LORA)
    lora_alpha: int = setting(16, "LoRA alpha", check=_positive(), group=LORA)
    lora_dropout: float = setting(0.05, "LoRA dropout", check=(lambda v: 0 <= v < 1, ">= 0 and < 1"), group=LORA)
    lora_targets: list[str] = setting(["q_proj", "k_proj", "v_proj", "o_proj"], "module names LoRA is applied to "
                                      "(comma-separated)", group=LORA)
    train_embeddings: bool = setting(True, "train the input embeddings (LongLoRA; requires_grad, not "
                                           "modules_to_save)", group=LORA)
    train_norms: bool = setting(True, "train every normalization layer", group=LORA)
    # optimization (Appendix B.2)
    lr: float = setting(2e-5, "AdamW learning rate", check=_positive(), group=OPTIM)
    warmup_steps: int = setting(30, "linear warm-up steps", check=_at_least(0), group=OPTIM)
    lr_scheduler: str = setting("constant_with_warmup", "HF scheduler name after warm-up", group=OPTIM)
    weight_decay: float = setting(0.0, "AdamW weight decay", check=_at_least(0), group=OPTIM)
    adam_eps: float = setting(1e-8, "AdamW epsilon (added to the root of the second moment)", check=_positive(),
                              group=OPTIM)
    max_grad_norm: float = setting(1.0, "gradient clipping", check=(lambda v: v >= 0, ">= 0 (0: no clipping)"),
                                   group=OPTIM)
    global_batch: int | None = setting(None, "global batch size in samples; default: 16 for data up to 24K tokens, "
                                             "8 above (B.2: 16 at 16K, 8 at 32K)", check=_at_least(1), group=OPTIM)
    micro_batch: int = setting(1, "samples per device per forward pass", check=_at_least(1), group=OPTIM)
    max_steps: int = setting(500, "optimizer steps (the one setting a resume may raise)", check=_at_least(1),
                             resume="grow", group=OPTIM)
    save_steps: int = setting(50, "checkpoint every N steps", check=_at_least(1), group=OPTIM)
    save_total_limit: int | None = setting(None, "keep at most N checkpoints; default: all", check=_at_least(1),
                                           group=OPTIM)
    logging_steps: int = setting(1, "log every N steps", check=_at_least(1), group=OPTIM)
    seed: int = setting(42, "seed (data order, LoRA init, dropout)", group=OPTIM)
    deterministic: bool = setting(False, "deterministic kernels (torch.use_deterministic_algorithms; slower): "
                                         "bit-identical reruns", group=OPTIM)
    # how
    deepspeed: str | None = setting(None, "DeepSpeed config: a JSON file or a name in ds_configs/ (zero2, "
                                          "zero2_offload, zero3, zero3_offload); default: none (plain PyTorch)",
                                    resume="path", group=HOW)
    ds_cpu_adam: str = setting("auto", "with an offloading DeepSpeed config: DeepSpeedCPUAdam (true), torch AdamW "
                                       "(false) or auto (CPUAdam on CUDA machines; torch AdamW on CPU, where "
                                       "building the op takes minutes)", choices=("auto", "true", "false"),
                               group=HOW)
    dtype: str = setting("auto", "weights' dtype; auto: bf16 on CUDA, fp32 on CPU", parse=dtype_name, choices=DTYPES,
                         group=HOW)
    attn: str = setting("auto", "attention: auto (on CUDA the faster of flash_attention_2, where importable, and "
                                "sdpa in a short check at the start; sdpa on CPU), sdpa, eager or flash_attention_2",
                        group=HOW)
    gradient_checkpointing: bool = setting(True, "recompute activations in backward", group=HOW)
    memory_plan: str = setting("auto", "where a step's tensors live and what is recomputed: fit (the fastest plan "
                                       "that fits the device's free memory and the host's: weights and optimizer "
                                       "on the GPU or offloaded, recompute of no / every k-th / every layer, "
                                       "checkpoints on the GPU then the host, MLP tiling; a plan that cannot fit "
                                       "is refused before the model loads), recipe (the DeepSpeed config's offload "
                                       "as written, every layer recomputed, checkpoint offload and MLP tiling from "
                                       "65536 tokens on CUDA) or auto (fit on CUDA, recipe on CPU); the flags "
                                       "below fix single choices", choices=("auto", "fit", "recipe"),
                               resume="ignore", group=HOW)
    offload_params: str = setting("auto", "ZeRO-3: the frozen weights in host memory (true) or on the GPU (false); "
                                          "auto: the memory plan's choice", choices=("auto", "true", "false"),
                                  resume="ignore", group=HOW)
    offload_optimizer: str = setting("auto", "ZeRO-2/3: the optimizer state in host memory with DeepSpeed's CPU "
                                             "Adam (true) or on the GPU (false); auto: the memory plan's choice",
                                     choices=("auto", "true", "false"), resume="ignore", group=HOW)
    recompute_every: int | None = setting(None, "recompute every k-th decoder layer's activations in backward (1: "
                                                "every layer, 0: none, the others kept from forward); default: the "
                                                "memory plan's choice", check=(lambda v: v >= 0, ">= 0"),
                                          resume="ignore", group=HOW)
    checkpoint_block: int | None = setting(None, "with every layer recomputed, store one checkpoint per block of k "
                                                 "layers (the others' inputs recomputed from it in backward); "
                                                 "default: the memory plan's choice", check=_at_least(1),
                                           resume="ignore", group=HOW)
    gpu_checkpoints: int | None = setting(None, "with --offload-checkpoints: how many stored checkpoints (the top "
                                                "ones) stay on the GPU; default: as many as the memory plan fits",
                                          check=(lambda v: v >= 0, ">= 0"), resume="ignore", group=HOW)
    offload_checkpoints: str = setting("auto", "copy stored decoder-layer checkpoints (their inputs) to pinned CPU "
                                               "memory on a side stream after the layer's forward and prefetch them "
                                               "back before its recompute: true, false or auto (the memory plan's "
                                               "choice); refused when host memory cannot hold them",
                                       choices=("auto", "true", "false"), resume="ignore", group=HOW)
    tile_mlp: int | None = setting(None, "compute each decoder layer's MLP over sequence chunks of N tokens, each "
                                         "chunk recomputed in backward, so the MLP's intermediate activations "
                                         "never exist for the whole sequence: N, 0 = off, or auto (default: the "
                                         "memory plan's choice: the model's hidden size where tiled)",
                                   check=(lambda v: v >= 0, ">= 0 (0: off)"), resume="ignore", group=HOW)
    tile_attention: int | None = setting(None, "recompute each decoder layer by sequence chunks of N tokens (its "
                                               "queries over all keys, its MLP per chunk), so that one layer's "
                                               "recompute holds chunk-sized activations: N, 0 = off (default: the "
                                               "memory plan's choice: the hidden size where it is the lever that "
                                               "fits)", check=(lambda v: v >= 0, ">= 0 (0: off)"),
                                         resume="ignore", group=HOW)
    chunk_head: str = setting("auto", "under ZeRO-3 in one process, run the LM head in --head-chunk chunks too "
                                      "(true; each chunk's logits recomputed in backward) or in one call over "
                                      "every labelled position (false); auto: the memory plan's choice",
                              choices=("auto", "true", "false"), resume="ignore", group=HOW)
    device_memory_gib: float | None = setting(None, "plan for this much free device memory (GiB) instead of what "
                                                    "the device reports (on CPU: the host's available memory)",
                                              check=_positive(), resume="ignore", group=HOW)
    host_memory_gib: float | None = setting(None, "plan for this much available host memory (GiB) instead of what "
                                                  "the machine reports", check=_positive(), resume="ignore",
                                            group=HOW)
    sdpa_backend: str = setting("auto", "SDPA's kernel on CUDA: auto (the fastest in a short check at the start, "
                                        "recorded in run.json), default (SDPA's own order), cudnn, flash, efficient "
                                        "or math", choices=("auto", "default", "cudnn", "flash", "efficient", "math"),
                                resume="ignore", group=HOW)
    sequence_parallel: int = setting(1, "split each sample over K processes (DeepSpeed Ulysses sequence "
                                        "parallelism; needs a DeepSpeed config and a launch of a multiple of K "
                                        "processes; the attention heads and KV heads must divide by K): K, 1 = off",
                                     check=_at_least(1), group=HOW)
    head_chunk: int = setting(4096, "label positions per LM-head chunk (each chunk's logits are recomputed in "
                                    "backward, so at most one chunk of logits is alive)", check=_at_least(1),
                              group=HOW)
    default_data_factor: float = setting(2.0, "tiny default data: target sample length = factor x the model's "
                                              "original context (capped by the extended context)",
                                         check=_positive(), group=HOW)
    num_workers: int = setting(0, "data loader workers", check=_at_least(0), group=HOW)
    report_to: str = setting("none", "also send the training logs to tensorboard or wandb (transformers' own "
                                     "integrations; pip install tensorboardX or wandb); RUN/train_curves.png is "
                                     "drawn either way", choices=REPORT_TO, resume="ignore", group=HOW)


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """Every TrainSettings flag (absent from the namespace unless given, so they override a recipe) and --recipe."""
    add_settings(parser, TrainSettings, recipe_help="YAML recipe (recipes/*.yaml or a path); flags override it")


def load_recipe(path: str | Path) -> dict:
    """A recipe's values (checked; unknown keys and wrong types are errors naming file:line). A bare name is
    looked up in recipes/."""
    return read_recipe(path, TrainSettings, search=RECIPES_DIR)


def recipe_for(flags: dict, recipe: str | None) -> str | None:
    """The recipe a run uses: ``--recipe``, else the tiny demo's for the tiny default model (no --model given)."""
    from ropescale.common.models import is_tiny

    if recipe is None and "model" not in flags and is_tiny(TrainSettings.model) and TINY_DEMO_RECIPE.is_file():
        return str(TINY_DEMO_RECIPE)
    return recipe


def settings_from_args(args: argparse.Namespace) -> tuple[TrainSettings, str | None]:
    """(the settings a parsed command line asks for, the recipe used): defaults < recipe < the flags given."""
    recipe = recipe_for(given(args, TrainSettings), getattr(args, "recipe", None))
    return from_args(args, TrainSettings, recipe=recipe, search=RECIPES_DIR), recipe


def resolve_ds_config(name: str | None) -> Path | None:
    """A DeepSpeed config path from a path or a name in ds_configs/."""
    if not name:
        return None
    p = Path(name)
    if p.is_file():
        return p
    alt = DS_CONFIGS_DIR / (name if name.endswith(".json") else f"{name}.json")
    if alt.is_file():
        return alt
    raise InputError(f"no such DeepSpeed config (a JSON file, or one of "
                     f"{', '.join(sorted(x.stem for x in DS_CONFIGS_DIR.glob('*.json')))})", name)


def default_global_batch(max_len: int) -> int:
    """Appendix B.2: global batch 16 for ~16K samples, 8 for ~32K samples (split at 24K tokens)."""
    return 16 if max_len <= 24 * 1024 else 8
