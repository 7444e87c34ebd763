"""Every reliance on an internal or version-specific behaviour of transformers, peft, deepspeed and accelerate, in
one place. Each shim has a comment saying which versions need it; tests/test_compat.py checks each one against the
installed versions and fails with "LIBRARY VERSION changed WHAT: see compat.SHIM" when a release changes it.

On the floor: only the standard library is imported here; third-party libraries are imported inside the functions
(importing this module stays cheap), and nothing from ropescale's stages.

Where the tree relied on them (grep of the package for transformers / peft / deepspeed / accelerate internals and
version-dependent names, 2026-11-25), and the shim each now goes through:

transformers
- RoPE config layout, 5.x ``rope_parameters`` (rope_theta inside) vs 4.x ``rope_scaling`` + ``rope_theta``
  (rope_scaling/hf.py; evaluation/backends/vllm.py's vLLM overrides): :func:`rope_layout`, :func:`read_rope_entries`,
  :func:`write_rope_entries`, :func:`rope_key`. The library must be 5.13+ (pyproject.toml says why), but config.json
  files and config dicts in the 4.x layout are still read and written in their own layout.
- the dtype field, ``dtype`` (5.x) vs ``torch_dtype`` (4.x, and 4.x-era config.json files), on configs and in
  ``from_pretrained`` (rope_scaling/load.py, training/saving.py merge, tiny/build.py): :func:`config_dtype`,
  :func:`set_config_dtype`, :func:`dtype_kwargs`
- ``forward(logits_to_keep=)`` (``num_logits_to_keep`` before 4.50; engine.py prefill, probes/scorer.py):
  :func:`last_logits_kwargs`
- the attention implementation lives in the private ``config._attn_implementation``; attention functions are
  registered with ``AttentionInterface`` and called as ``fn(module, q, k, v, mask, dropout=, scaling=, ...)``;
  transformers' own SDPA function (engine.py, backends/hf.py): :func:`attn_implementation`,
  :func:`using_attention`, :func:`register_attention`, :func:`sdpa_attention`
- a decoder given a prepared 4D additive mask uses it as is (5.x; engine.supported): :func:`prepared_mask_blocker`
- document masking and explicit position ids (training/doc_mask.py; written against 5.24.0):
  - ``masking_utils._preprocess_mask_arguments``: a 4D ``attention_mask`` tensor is "already prepared, or custom" and
    is returned as is, so the decoders of Llama / Qwen2 / Mistral (``create_causal_mask``) hand a block-diagonal mask
    built by training/doc_mask.py to every layer unchanged: :func:`custom_mask_passes_through`.
  - ``masking_utils.find_packed_sequence_indices``: with ``attention_mask=None`` and no cache, consecutive position ids
    whose step is not 1 start a new attention block (a packed-sequence heuristic). PoSE's skips would silently cut a
    sample into chunks that cannot attend to each other; an explicit 2D ``attention_mask`` (all ones) turns the
    heuristic off: :func:`implied_blocks` (what the heuristic would make of position ids).
  - ``integrations.sdpa_attention.sdpa_attention_forward`` passes the mask to torch SDPA, where a bool mask means True =
    attend; eager attention (``eager_attention_forward`` of each model) adds the mask to the scores, so it takes an
    additive float mask: :func:`mask_format`.
  - ``modeling_flash_attention_utils._flash_attention_forward`` takes the ``FlashAttentionKwargs`` ``cu_seq_lens_q``,
    ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k`` (passed through the model's ``forward(**kwargs)`` to each
    attention layer); with ``attention_mask=None`` it flattens (B, T) into B*T tokens and calls
    ``flash_attn_varlen_func`` with them: :data:`VARLEN_KWARGS`, :func:`varlen_kwargs_accepted`.
- the model forward's cache argument and the outputs' cache field (engine.py, probes/scorer.py): ``cache`` from 5.24
  (``past_key_values`` warns "deprecated" there and goes in 5.40), ``past_key_values`` before: :func:`cache_kwargs`,
  :func:`output_cache`
- the KV-cache protocol (engine.SlotCache, engine._prefill_writer): attention layers call
  ``past_key_values.update(key, value, layer_idx, ...)`` (5.24 passes ``kwargs=``, earlier ``cache_kwargs``) and
  attend to what it returns; ``DynamicCache(config=)``: :class:`DuckCache`, :func:`writer_cache`
- rotary modules, in :mod:`ropescale.common.compat.rope` (import them from there): the dynamic-NTK internals
  (``rope_type``, ``inv_freq``, ``original_inv_freq``, ``original_max_seq_len``, ``max_seq_len_cached``,
  ``attention_scaling``, the ``dynamic_rope_update`` decorator on ``forward``, which reads the length as
  ``max(position_ids) + 1``, ``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=)``, the config's
  ``rope_parameters["original_max_position_embeddings"]``), and the one wrapper that installs this repo's rules on
  a module's class: per sequence (rope_scaling/load.py: dynamic YaRN in every forward; probes/rope_search.py:
  candidate frequencies), the whole sample's length for a shard (training/sequence_parallel.py), per decode slot
  or with fixed frequencies (evaluation/rope_rules.py: dynamic NTK per slot, LongRoPE's factor set per sample):
  :func:`~ropescale.common.compat.rope.wrap_rotary`, ``install_length_rope``, ``install_global_length``,
  ``rope_forward``, ``per_row_forward``, ``fixed_rope``, with ``dynamic_rope_modules``, ``reset_dynamic_rope``,
  ``rope_frequencies``, ``rope_frequencies_for_length``, ``undecorated_rope_forward``, ``longrope_frequencies``
- gradient checkpointing: checkpointed layers carry ``gradient_checkpointing = True`` and call
  ``self._gradient_checkpointing_func(fn, *args)`` (training/memory/offload.py): :func:`checkpointed_modules`,
  :func:`set_checkpoint_function`
- ``config.get_text_config()`` (training/memory/install.py): :func:`text_config`
- Trainer internals (training/trainer.py): ``compute_loss(..., num_items_in_batch)``, the private
  ``model_accepts_loss_kwargs`` (the Trainer divides the loss by the accumulation steps unless it is set),
  ``args.average_tokens_across_devices`` with ``accelerator.num_processes``: :func:`trainer_takes_token_sums`,
  :func:`token_mean_world_factor`; Trainer callbacks that print to stdout (training/run.py):
  :func:`stdout_callbacks`; ``TrainerCallback.on_save`` runs after ``checkpoint-N`` is written
  (trainer.ExportCallback; tested only); the Trainer gives accelerate 1 accumulation step under DeepSpeed
  (trainer.LabelOnlyTrainer): :func:`agree_grad_accum`; the warm-up schedules of ``get_scheduler`` are a torch
  ``LambdaLR`` whose lambdas give 0 at step 0, and the Trainer (also under DeepSpeed) builds its scheduler with
  ``create_scheduler`` (trainer.LabelOnlyTrainer): :func:`warmup_from_first_step`
peft
- trained parameter names start with ``base_model.model.`` (training/saving.py): :data:`PEFT_PREFIX`
- ``get_peft_model`` / ``PeftModel.from_pretrained`` take ``autocast_adapter_dtype`` (training/model.py, saving.py):
  :func:`peft_keep_dtype`
- ``set_peft_model_state_dict`` returns the load result with ``unexpected_keys`` (saving.py):
  :func:`peft_unexpected_keys`
deepspeed
- ZeRO-3 partitioned parameters carry ``ds_id`` / ``ds_numel`` (memory.py, loss.py, model.py, saving.py):
  :func:`is_zero3_param`, :func:`param_numel`
- ``deepspeed.zero.GatheredParameters(params, modifier_rank=)`` (saving.py): :func:`zero3_gathered`
- ``param.ds_grad_is_ready`` (ZeRO-3 reduces a gradient only when it is true; memory._TiledMLP):
  :func:`defer_zero3_reduce`
- ``deepspeed.comm.torch.build_shm_op`` (JIT-compiles a CPU shared-memory op at init; common/process.py):
  :func:`disable_deepspeed_shm_op`
- the ``DeepSpeed`` logger writes to stdout (common/cli.logs_to_stderr): :data:`STDOUT_LOGGERS`
accelerate
- the ``OMP_NUM_THREADS/MKL_NUM_THREADS unset`` warning (common/cli.quiet_libraries): :data:`QUIET_WARNINGS`

Not here: vLLM's rope fields (evaluation/backends/vllm.py, vllm_settings: vLLM is optional and GPU-only;
tests/test_eval_vllm.py covers the versions seen), torch's private allocator setter (common/process.py; torch is
pinned), training/run.py (above), bench/ (public APIs only) and tests/, which read some of these internals directly as
independent references (ROPE_INIT_FUNCTIONS in test_rope_scaling, _gradient_checkpointing_func in
test_training_memory).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re


def version(dist: str) -> tuple[int, ...]:
    """The installed release of ``dist`` as integers (``5.24.0`` -> (5, 24, 0)); () when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        v = _v(dist)
    except PackageNotFoundError:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


# ================================================================ transformers: config layout
# Plain dicts (a loaded config.json) and config objects alike.
def config_get(cfg, key: str, default=None):
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def config_has(cfg, key: str) -> bool:
    if isinstance(cfg, dict):
        return key in cfg
    try:
        getattr(cfg, key)
        return True
    except AttributeError:
        return False


def config_set(cfg, key: str, value) -> None:
    if isinstance(cfg, dict):
        cfg[key] = value
    else:
        setattr(cfg, key, value)


def rope_layout(cfg) -> str | None:
    """'5' (transformers >= 5.0: everything in ``rope_parameters``, rope_theta inside), '4' (< 5.0:
    ``rope_scaling`` + top-level ``rope_theta``), None when the config has no RoPE fields. A 5.x library converts a
    4.x config.json into ``rope_parameters`` when it loads it; plain dicts keep what the file says."""
    rp = config_get(cfg, "rope_parameters")
    if isinstance(rp, dict) and rp:
        return "5"
    if config_has(cfg, "rope_theta") or (isinstance(cfg, dict) and "rope_scaling" in cfg) or (
            not isinstance(cfg, dict) and not config_has(cfg, "rope_parameters") and config_has(cfg, "rope_scaling")):
        return "4"
    return None


def rope_key(cfg) -> str:
    """The config key that holds the rope-type dict: ``rope_parameters`` (5.x) or ``rope_scaling`` (4.x, and
    configs without RoPE fields)."""
    return "rope_parameters" if rope_layout(cfg) == "5" else "rope_scaling"


GLOBAL_LAYERS = "full_attention"  # the layer type whose rope a per-layer-type config scales (Gemma 3's global layers)


def rope_layer_types(cfg) -> tuple[str, ...]:
    """The layer types a 5.x per-layer-type ``rope_parameters`` is keyed by (Gemma 3: full_attention,
    sliding_attention); () when one rope serves every layer."""
    if rope_layout(cfg) != "5":
        return ()
    return tuple(k for k, v in config_get(cfg, "rope_parameters").items() if isinstance(v, dict))


def read_rope_entries(cfg, default_theta: float, default_type: str, layer_type: str | None = None) -> dict:
    """The config's rope entries as one flat 5.x-style dict (rope_type, rope_theta, the type's keys; 4.x's "type"
    read as rope_type; ``default_type``, the unscaled rope_type, where a 4.x config has no rope_scaling). A
    per-layer-type ``rope_parameters`` (Gemma 3 / 4) gives the entries of ``layer_type`` (default
    :data:`GLOBAL_LAYERS`). ValueError when there are no RoPE fields, or no entry for that layer type."""
    layout = rope_layout(cfg)
    if layout is None:
        raise ValueError("config has no RoPE fields (rope_parameters, or rope_theta / rope_scaling): not a RoPE model")
    if layout == "5":
        e = dict(config_get(cfg, "rope_parameters"))
        types = rope_layer_types(cfg)
        if types:
            lt = layer_type or GLOBAL_LAYERS
            if lt not in types:
                raise ValueError(f"per-layer rope_parameters without a {lt!r} entry (it has {', '.join(types)})")
            e = dict(e[lt])
    else:
        e = dict(config_get(cfg, "rope_scaling") or {})
        e["rope_theta"] = config_get(cfg, "rope_theta", default_theta)
    e["rope_type"] = e.pop("type", None) or e.get("rope_type") or default_type
    if e.get("rope_theta") is None:
        e["rope_theta"] = default_theta
    return e


def write_rope_entries(cfg, entries: dict, max_pos: int, default_type: str, layer_type: str | None = None) -> None:
    """Replace the config's rope entries by ``entries`` (complete, flat 5.x style) in the config's own layout and set
    max_position_embeddings. 4.x: rope_theta goes top-level, the rest into ``rope_scaling`` with both "type" and
    "rope_type" (None for ``default_type``, the unscaled rope_type); 5.x: the whole dict into ``rope_parameters``
    (per layer type: that type's entry, ``layer_type`` default :data:`GLOBAL_LAYERS`, the others kept), and a
    Phi3-style top-level ``original_max_position_embeddings`` is kept in step (5.x gives it priority over the one
    inside)."""
    if rope_layer_types(cfg):
        rp = {k: dict(v) for k, v in config_get(cfg, "rope_parameters").items()}
        rp[layer_type or GLOBAL_LAYERS] = dict(entries)
        config_set(cfg, "rope_parameters", rp)
    elif rope_layout(cfg) == "5":
        config_set(cfg, "rope_parameters", dict(entries))
    else:
        rest = {k: v for k, v in entries.items() if k != "rope_theta"}
        config_set(cfg, "rope_theta", entries["rope_theta"])
        t = rest["rope_type"]
        config_set(cfg, "rope_scaling", None if t == default_type else {**rest, "type": t})
    config_set(cfg, "max_position_embeddings", int(max_pos))
    key = "original_max_position_embeddings"
    if config_get(cfg, key) is not None and key in entries:
        config_set(cfg, key, entries[key])


# ================================================================ transformers: dtype
# 5.x (and 4.56+) name it ``dtype`` on configs and in from_pretrained; older releases ``torch_dtype``, which 5.x keeps
# as a deprecated alias (config.json files written by 4.x still carry it).
def dtype_kwargs(dtype) -> dict:
    """``from_pretrained(**dtype_kwargs(torch.float32))``."""
    return {"dtype": dtype}


def config_dtype(config):
    """The dtype a config records (a torch.dtype or its name; ``torch_dtype`` of a 4.x-era config), or None."""
    return getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)


def set_config_dtype(config, value) -> None:
    config.dtype = value


# ================================================================ transformers: model forward and attention
def last_logits_kwargs(n: int) -> dict:
    """Forward kwargs for logits of the last ``n`` positions only: ``logits_to_keep`` (4.50+, 5.x; 4.46 called it
    ``num_logits_to_keep``)."""
    return {"logits_to_keep": int(n)}


@functools.lru_cache(maxsize=None)
def cache_name() -> str:
    """The name of the cache in a model's forward and in its outputs: ``cache`` (transformers 5.24+; the old name
    ``past_key_values`` warns until 5.40, then is gone), ``past_key_values`` before 5.24."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def cache_kwargs(cache) -> dict:
    """Forward kwargs that hand the model a KV cache (:func:`cache_name`)."""
    return {cache_name(): cache}


def output_cache(out):
    """The KV cache a forward with ``use_cache=True`` returned (:func:`cache_name`)."""
    return getattr(out, cache_name())


def attn_implementation(config, default: str = "sdpa") -> str:
    """The attention implementation a loaded model runs (private ``config._attn_implementation``, all versions)."""
    return getattr(config, "_attn_implementation", None) or default


@contextlib.contextmanager
def using_attention(config, name: str):
    """Run the model's attention layers with the registered function ``name`` inside the block: every layer reads
    ``config._attn_implementation`` as it runs (4.48+ attention refactor; the same in 5.x)."""
    impl = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = impl


def register_attention(name: str, fn) -> None:
    """``AttentionInterface.register`` (4.48+). ``fn(module, query, key, value, attention_mask, dropout=,
    scaling=, is_causal=, **kw) -> (out [B, T, H, D], weights)``; query/key/value are ``[B, heads, T, D]``."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, fn)


def sdpa_attention():
    """transformers' SDPA attention function (same signature as a registered one)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


# SDPA's kernels by this project's names (torch.nn.attention.SDPBackend members, torch 2.3+; cuDNN's since 2.3)
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
_PREFERRED: list = []  # the sdpa_kernel contexts prefer_sdpa_backend entered (left only by reset_sdpa_backend)


def sdpa_backend_context(name: str | None):
    """Only SDPA kernel ``name`` inside the block (``torch.nn.attention.sdpa_kernel``); None: nothing changed."""
    import contextlib

    if not name:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def prefer_sdpa_backend(name: str) -> str:
    """SDPA tries kernel ``name`` first for the rest of the process, the others behind it for inputs it does not
    take: ``sdpa_kernel(order, set_priority=True)`` (torch 2.6+) entered and not left ("priority"); where
    set_priority does not exist, that kernel alone ("exclusive")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = dict.fromkeys([name, "cudnn", "flash", "efficient", "math"])
    order = [getattr(SDPBackend, SDPA_BACKENDS[n]) for n in names]
    try:
        cm, how = sdpa_kernel(order, set_priority=True), "priority"
    except TypeError:
        cm, how = sdpa_kernel(order[0]), "exclusive"
    cm.__enter__()
    _PREFERRED.append(cm)
    return how


def reset_sdpa_backend() -> None:
    """Undo :func:`prefer_sdpa_backend` (SDPA's own kernel order again)."""
    while _PREFERRED:
        _PREFERRED.pop().__exit__(None, None, None)


def prepared_mask_blocker() -> str | None:
    """None when decoder models take a prepared 4D additive mask as is (transformers 5.x); else why not (a guard:
    pyproject.toml requires 5.13+, but an environment of your own may hold anything)."""
    from transformers import __version__

    if version("transformers")[:1] < (5,):
        return f"transformers {__version__} (the slot decoder needs 5.x)"
    return None


# ================================================================ transformers: KV cache
class DuckCache:
    """A cache object the model's attention layers accept as ``past_key_values``: they call ``update(key, value,
    layer_idx, ...)`` and attend to the (key, value) it returns. The trailing arguments changed (``cache_kwargs``
    positional before 5.24, ``kwargs=`` keyword in 5.24) and are ignored here; subclasses implement :meth:`write`.
    ``get_seq_length`` is asked when no positions are passed (they always are here)."""

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.write(key_states, value_states, layer_idx)

    def write(self, key_states, value_states, layer_idx: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


_WRITER = None


def writer_cache(config, write):
    """A ``DynamicCache`` (constructed with ``config=``, 5.x) that stores nothing: ``update`` hands each layer's
    key/value to ``write(key, value, layer_idx)`` and returns them unchanged. To the model and its mask builder
    it is an empty cache (plain causal path). One class per process: a class made per call would sit in a
    reference cycle and pin what ``write`` holds until the next garbage collection."""
    global _WRITER
    if _WRITER is None:
        from transformers import DynamicCache

        class _Writer(DynamicCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                self._ropescale_write(key_states, value_states, layer_idx)
                return key_states, value_states

        _WRITER = _Writer
    w = _WRITER(config=config)
    w._ropescale_write = write
    return w


# ================================================================ transformers: gradient checkpointing, configs
def checkpointed_modules(root) -> list:
    """Modules that transformers checkpoints: a true ``gradient_checkpointing`` attribute (the decoder layers,
    ``GradientCheckpointingLayer`` since 4.52; the decoder itself in older releases)."""
    return [m for m in root.modules() if getattr(m, "gradient_checkpointing", False) is True]


def set_layer_checkpointing(module, on: bool) -> None:
    """Checkpoint one layer or not (selective recompute): transformers checks the layer's own
    ``gradient_checkpointing`` attribute at each call (``GradientCheckpointingLayer``, 4.52+ and 5.x)."""
    module.gradient_checkpointing = bool(on)


def set_checkpoint_function(module, fn) -> None:
    """A checkpointed layer runs ``module._gradient_checkpointing_func(forward, *args)`` in training (all versions
    in range): ``fn`` replaces torch's checkpoint there."""
    module._gradient_checkpointing_func = fn


def text_config(config):
    """The text part of a (possibly multimodal) config: ``get_text_config()`` (4.47+), else the config."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


# ================================================================ transformers: Trainer
def trainer_takes_token_sums(trainer) -> None:
    """Our ``compute_loss`` divides by ``num_items_in_batch`` (the step's labelled tokens, all micro-batches and
    ranks; passed since 4.46): the Trainer must then not divide by the accumulation steps again. It skips that
    division when the private ``model_accepts_loss_kwargs`` is true (4.46+, 5.x)."""
    trainer.model_accepts_loss_kwargs = True


def token_mean_world_factor(trainer) -> int:
    """With ``average_tokens_across_devices`` (4.50+, default true in 5.x) ``num_items_in_batch`` counts every
    rank's tokens while DDP / DeepSpeed average the ranks' gradients: the loss is multiplied by the number of
    processes, as the Trainer's own compute_loss does."""
    n = int(getattr(trainer.accelerator, "num_processes", 1))
    return n if getattr(trainer.args, "average_tokens_across_devices", False) and n > 1 else 1


def agree_grad_accum(trainer) -> None:
    """Under DeepSpeed, give accelerate the Trainer's gradient accumulation steps (call after the Trainer built its
    accelerator). transformers 5.x's Trainer accumulates itself and builds the Accelerator with a
    GradientAccumulationPlugin of 1 step, while the DeepSpeed config it fills says args.gradient_accumulation_steps;
    accelerate's ``_prepare_deepspeed`` then warns ("Gradient accumulation steps mismatch", seen with 1.15) and takes
    DeepSpeed's value. Setting that value first is the same end state, without a warning no user can act on."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        trainer.accelerator.gradient_accumulation_steps = trainer.args.gradient_accumulation_steps


def warmup_from_first_step(scheduler, warmup: int):
    """A warm-up that starts above 0: transformers' warm-up schedules (``get_scheduler``: a torch ``LambdaLR`` whose
    multipliers are ``step / warmup`` during the warm-up, so 0 at step 0; 4.x and 5.x alike) run the first optimizer
    step at learning rate 0, a step that changes nothing. Returns a ``LambdaLR`` over the same optimizer whose
    multiplier at step s < ``warmup`` is the old one's at s + 1 (the first step at lr / warmup, the last warm-up step
    at the full rate) and the old one's after it; ``scheduler`` itself when it is no ``LambdaLR`` or there is no
    warm-up. Relies on ``LambdaLR.lr_lambdas`` (the multipliers, a public attribute) and on a new LambdaLR taking the
    optimizer's recorded ``initial_lr`` as its base rates. The multipliers are plain functions, so the scheduler's
    state_dict stays a plain dict (a checkpoint's scheduler.pt loads with ``weights_only``)."""
    from torch.optim.lr_scheduler import LambdaLR

    if warmup <= 0 or type(scheduler) is not LambdaLR:
        return scheduler

    def shifted(f):
        return lambda step: f(step + 1) if step < warmup else f(step)

    return LambdaLR(scheduler.optimizer, [shifted(f) for f in scheduler.lr_lambdas])


def stdout_callbacks() -> tuple:
    """The Trainer's default callbacks that print log dicts to stdout (ours go to stderr)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    return PrinterCallback, ProgressCallback


# ================================================================ peft
PEFT_PREFIX = "base_model.model."  # PeftModel(LoraModel(model)): every parameter name starts with it (all versions)


def peft_keep_dtype() -> dict:
    """Adapters in the model's dtype, not fp32 (``autocast_adapter_dtype``, peft 0.12+)."""
    return {"autocast_adapter_dtype": False}


def peft_unexpected_keys(result) -> list:
    """Keys ``set_peft_model_state_dict`` did not use (it returns torch's load result: 0.9+)."""
    return list(getattr(result, "unexpected_keys", []) or [])


# ================================================================ deepspeed
def is_zero3_param(p) -> bool:
    """A parameter partitioned by ZeRO-3 (all deepspeed versions mark it with ``ds_id``)."""
    return hasattr(p, "ds_id")


def param_numel(p) -> int:
    """A parameter's full size, also when ZeRO-3 partitioned it (``ds_numel``)."""
    n = getattr(p, "ds_numel", None)
    return p.numel() if n is None else n


def zero3_gathered(params, modifier_rank):
    """``deepspeed.zero.GatheredParameters(params, modifier_rank=)``: the full parameters inside the block (a
    collective: all ranks enter it); with ``modifier_rank`` r, rank r's changes are partitioned again on exit."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def defer_zero3_reduce(params, ready: bool) -> None:
    """ZeRO-3 reduces a parameter's gradient after a backward only when ``param.ds_grad_is_ready`` is true
    (deepspeed 0.17.0+, for tiled computations that run backward several times per step); 0.16.x and older ignore
    the flag and reduce after every tile (wrong gradients: hence deepspeed>=0.17 in requirements-deepspeed.txt)."""
    for p in params:
        p.ds_grad_is_ready = ready


def disable_deepspeed_shm_op() -> bool:
    """Keep deepspeed's torch comm backend from JIT-compiling its CPU shared-memory op (``build_shm_op`` in
    ``deepspeed.comm.torch``, 0.15 to 0.19 at least); False when deepspeed is not installed."""
    import importlib

    try:
        mod = importlib.import_module("deepspeed.comm.torch")
    except Exception:  # deepspeed missing or broken: nothing to disable
        return False
    mod.build_shm_op = lambda: None
    return True


# ================================================================ logging and warnings
# loggers that write to stdout by default (deepspeed's "DeepSpeed" logger, all versions); their handlers are pointed
# at stderr so results on stdout stay clean
STDOUT_LOGGERS = ("DeepSpeed", "deepspeed", "accelerate", "torch.distributed")

QUIET_WARNINGS = (
    # (category, message regex, module regex): warnings from libraries about their own internals
    (FutureWarning, "", r"(torch|transformers|deepspeed|peft|accelerate)(\.|$)"),
    (DeprecationWarning, "", r"(torch|transformers|deepspeed|peft|accelerate|jieba|pkg_resources)(\.|$)"),
    (UserWarning, r".*(TypedStorage|torch\.utils\._pytree|None of the inputs have requires_grad|"
                  r"use_reentrant|Casting complex values|The given NumPy array is not writable)", ""),
    # accelerate's state.py (1.x) when it sets the thread count itself
    (UserWarning, r"OMP_NUM_THREADS/MKL_NUM_THREADS unset", r"accelerate(\.|$)"),
)


# --- document masking and explicit position ids (training/doc_mask.py; see the module doc) ---
# how each attention implementation takes a document mask (see module doc)
MASK_FORMATS = {"sdpa": "bool", "eager": "additive", "flash_attention_2": "varlen", "flash_attention_3": "varlen"}
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def mask_format(attn_implementation: str) -> str:
    """``bool`` (SDPA: a 4D mask, True = attend), ``additive`` (eager: a 4D float mask, 0 or the dtype's minimum) or
    ``varlen`` (FlashAttention: :data:`VARLEN_KWARGS`, no mask); ValueError for another implementation."""
    try:
        return MASK_FORMATS[attn_implementation]
    except KeyError:
        raise ValueError(f"document masking supports attention {', '.join(MASK_FORMATS)}, not "
                         f"{attn_implementation!r}") from None


def custom_mask_passes_through() -> bool:
    """Whether transformers' mask preparation returns a 4D mask tensor unchanged (``_preprocess_mask_arguments``'
    early exit), the way a custom block-diagonal mask reaches the attention layers."""
    import torch
    from transformers import masking_utils

    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    out = masking_utils._preprocess_mask_arguments(None, None, mask, None, None, None)
    return bool(out[0]) and out[1] is mask


def implied_blocks(position_ids):
    """What transformers' packed-sequence heuristic makes of ``position_ids`` (B, T) when no attention mask is given:
    a block index per token (a new block wherever the step is not 1), or None when every row is one block."""
    from transformers import masking_utils

    return masking_utils.find_packed_sequence_indices(position_ids)


def varlen_kwargs_accepted() -> bool:
    """Whether transformers' FlashAttention entry point takes :data:`VARLEN_KWARGS`."""
    from transformers import modeling_flash_attention_utils as fa

    params = inspect.signature(fa._flash_attention_forward).parameters
    return all(k in params for k in VARLEN_KWARGS)
