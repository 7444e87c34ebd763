"""Model setup: the model under its RoPE setting, LoRA and what else is trained; the causal LM inside a wrapper.

Paper Sec 5 (after LongLoRA): LoRA rank 8, and the embedding and normalization layers unfrozen. The extra
trained tensors are switched on with ``requires_grad`` (not PEFT ``modules_to_save``, which keeps a copy that
DeepSpeed ZeRO-3 saves as empty tensors); every trained tensor has the model's dtype (ZeRO-3 asserts on mixed
dtypes; DeepSpeed keeps fp32 master weights itself).
"""
from __future__ import annotations

import importlib.util

import torch

from ropescale.common.cli import torch_dtype
from ropescale.common.compat import param_numel, peft_keep_dtype
from ropescale.common.io import InputError

NORM_CLASS_HINTS = ("norm",)  # RMSNorm / LayerNorm / Qwen2RMSNorm / LlamaRMSNorm ...


def resolve_dtype(name: str, cuda: bool) -> torch.dtype:
    """``--dtype`` (ropescale.common.cli.DTYPES) as a torch dtype; auto: bf16 on CUDA, fp32 on CPU."""
    try:
        return torch_dtype(name, cuda=cuda)
    except ValueError as e:
        raise InputError(f"--dtype: {e}") from None


def resolve_attn(name: str, cuda: bool) -> str:
    """FlashAttention-2 when importable and on CUDA, otherwise SDPA."""
    name = (name or "auto").lower()
    if name == "auto":
        return "flash_attention_2" if cuda and importlib.util.find_spec("flash_attn") is not None else "sdpa"
    if name not in ("sdpa", "eager", "flash_attention_2"):
        raise InputError(f"unknown --attn {name!r} (auto, sdpa, eager, flash_attention_2)")
    if name == "flash_attention_2" and (not cuda or importlib.util.find_spec("flash_attn") is None):
        raise InputError("--attn flash_attention_2 needs CUDA and the flash_attn package")
    return name


def causal_lm_of(model):
    """The transformers CausalLM inside a PEFT model / DeepSpeed engine / the model itself."""
    m = getattr(model, "module", model)  # DeepSpeed engine / DDP
    if hasattr(m, "get_base_model"):  # PEFT
        m = m.get_base_model()
    return m


def load_model(cfg, dtype: torch.dtype, attn: str):
    """The causal LM of ``cfg`` (a ``rope_scaling.load.ModelConfig``: the rope already applied;
    ``rope_scaling.load.load_model``), no KV cache."""
    from rope_scaling.load import load_model as load

    model = load(cfg.path, cfg.config, dtype=dtype, attn=attn, state=cfg.state)
    model.config.use_cache = False
    return model


def is_norm_module(module) -> bool:
    return any(h in type(module).__name__.lower() for h in NORM_CLASS_HINTS)


def extra_trainable_names(causal_lm, embeddings: bool = True, norms: bool = True) -> list[str]:
    """Parameter names (relative to the causal LM) of the input embeddings and every normalization layer."""
    names = []
    if embeddings:
        emb = causal_lm.get_input_embeddings()
        for mname, mod in causal_lm.named_modules():
            if mod is emb:
                names += [f"{mname}.{p}" for p, _ in mod.named_parameters(recurse=False)]
                break
    if norms:
        for mname, mod in causal_lm.named_modules():
            if is_norm_module(mod):
                names += [f"{mname}.{p}" for p, _ in mod.named_parameters(recurse=False)]
    return names


def add_lora(model, *, r: int = 8, alpha: int = 16, dropout: float = 0.05, targets=("q_proj", "k_proj", "v_proj",
             "o_proj"), embeddings: bool = True, norms: bool = True, gradient_checkpointing: bool = True):
    """Wrap ``model`` with LoRA (adapters in the model's dtype: ``autocast_adapter_dtype=False``) and switch on
    the embeddings and norms. Returns (peft_model, extra parameter names relative to the causal LM)."""
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in targets if t not in present]
    if missing:
        raise InputError(f"LoRA target module(s) {missing} not in the model (it has e.g. "
                         f"{sorted(x for x in present if x.endswith('proj'))[:8]})")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lcfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none",
                      task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lcfg, **peft_keep_dtype())
    names = extra_trainable_names(peft_model.get_base_model(), embeddings, norms)
    params = dict(peft_model.get_base_model().named_parameters())
    for n in names:
        params[n].requires_grad_(True)
    return peft_model, names


def param_counts(model) -> tuple[int, int]:
    """(trainable, total) parameter counts (ZeRO-3 aware: partitioned params report ds_numel)."""
    tr = tot = 0
    for p in model.parameters():
        n = param_numel(p)
        tot += n
        if p.requires_grad:
            tr += n
    return tr, tot


def cast_trainable(model, dtype: torch.dtype) -> None:
    """Cast the trained tensors to ``dtype`` (fp32 master weights for a plain-PyTorch bf16 run)."""
    for p in model.parameters():
        if p.requires_grad and p.dtype != dtype:
            p.data = p.data.to(dtype)


def fp32_master(model, compute_dtype: torch.dtype) -> None:
    """Mixed precision without DeepSpeed: trained tensors in fp32 (so 2e-5 updates are not lost to bf16
    rounding), the forward in ``compute_dtype`` under autocast. The embedding lookup is not autocast, so its
    output is cast back to ``compute_dtype``: the residual stream (and the checkpointed activations) stay bf16,
    as in a plain bf16 model."""
    cast_trainable(model, torch.float32)
    emb = model.get_input_embeddings()

    def to_compute(_module, _inputs, out):
        return out.to(compute_dtype) if torch.is_tensor(out) and out.is_floating_point() else out

    emb.register_forward_hook(to_compute)
