"""The tiled MLP (ALST's TiledMLP, Bekman et al. 2025): each decoder layer's MLP over chunks of N tokens, its forward
under no_grad and each chunk recomputed in backward, so that the MLP's intermediate activations (gate, up,
act(gate), their product: 4 x T x intermediate x 2 bytes, 22 GiB at 256K for the 7B shape) never exist for the whole
sequence: 4 x N x intermediate x 2 bytes instead (344 MiB at N = 4096). The MLP runs once more per step. Also the
replay of a forward's autocast state and RNG (the dropout masks) that the recomputing paths share
(:mod:`.offload`'s block checkpoints, :mod:`.tiled_attention`)."""
from __future__ import annotations

import contextlib

import torch

from ropescale.common import compat
from ropescale.common.io import InputError

from ..model import causal_lm_of


def autocast_state(device_type: str) -> list[tuple[str, bool, torch.dtype]]:
    """The autocast state of the CPU and ``device_type`` (enabled, dtype), for a replay."""
    out = []
    for dt in dict.fromkeys(("cpu", device_type)):
        try:
            out.append((dt, torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt)))
        except (RuntimeError, TypeError):  # a device type without autocast
            continue
    return out


@contextlib.contextmanager
def replay_context(autocast, rng_state, device: torch.device):
    """Autocast as in the forward, and the RNG where the forward's chunks started (dropout masks match)."""
    cpu_rng, dev_rng = rng_state
    devices = [device] if device.type == "cuda" else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=devices, device_type="cuda"))
        torch.set_rng_state(cpu_rng)
        if dev_rng is not None:
            torch.cuda.set_rng_state(dev_rng, device)
        for dt, enabled, dtype in autocast:
            stack.enter_context(torch.amp.autocast(dt, enabled=enabled, dtype=dtype))
        yield


class _TiledMLP(torch.autograd.Function):
    """``fn`` (a position-wise MLP) over chunks of ``chunk`` rows of x (flattened to (rows, hidden)): forward keeps
    only x; backward recomputes one chunk at a time. The trained parameters of the MLP either come in as inputs
    (their gradients are summed over the chunks and returned: one accumulation, which DDP and ZeRO-1/2 expect) or,
    under ZeRO-3 (partitioned parameters cannot be inputs), are listed in ``zero3_params``: then every chunk's
    backward accumulates into them and DeepSpeed reduces only after the last chunk (``ds_grad_is_ready``)."""

    @staticmethod
    def forward(ctx, fn, chunk, zero3_params, x, *params):
        ctx.fn, ctx.chunk, ctx.zero3_params = fn, chunk, zero3_params
        ctx.params = params
        ctx.autocast = autocast_state(x.device.type)
        ctx.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.is_cuda else None)
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        out = None
        for s in range(0, flat.shape[0], chunk):
            o = fn(flat[s:s + chunk])
            if out is None:
                out = o.new_empty((flat.shape[0], o.shape[-1]))
            out[s:s + o.shape[0]] = o
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        fn, chunk, params, zero3 = ctx.fn, ctx.chunk, ctx.params, ctx.zero3_params
        need_x = ctx.needs_input_grad[3]
        flat = x.detach().reshape(-1, x.shape[-1])
        g = grad_out.reshape(-1, grad_out.shape[-1])
        x_grad = torch.empty_like(flat) if need_x else None
        p_grads: list[torch.Tensor | None] = [None] * len(params)
        starts = list(range(0, flat.shape[0], chunk))
        with torch.enable_grad(), replay_context(ctx.autocast, ctx.rng, x.device):
            for i, s in enumerate(starts):
                xc = flat[s:s + chunk].detach().requires_grad_(need_x)
                if zero3:
                    compat.defer_zero3_reduce(zero3, ready=i == len(starts) - 1)
                oc = fn(xc)
                gc = g[s:s + oc.shape[0]]
                if zero3:
                    torch.autograd.backward(oc, gc)
                    if need_x:
                        x_grad[s:s + oc.shape[0]] = xc.grad
                    continue
                want = ([xc] if need_x else []) + list(params)
                grads = torch.autograd.grad(oc, want, gc, allow_unused=True)
                if need_x:
                    x_grad[s:s + oc.shape[0]] = grads[0]
                    grads = grads[1:]
                for k, gp in enumerate(grads):
                    if gp is not None:
                        gp = gp.float()
                        p_grads[k] = gp if p_grads[k] is None else p_grads[k].add_(gp)
        p_out = [None if gp is None else gp.to(p.dtype) for gp, p in zip(p_grads, params)]
        return (None, None, None, None if x_grad is None else x_grad.view_as(x), *p_out)


def _tiled_forward(mlp, orig, chunk: int):
    def forward(x, *args, **kwargs):
        if args or kwargs or not torch.is_tensor(x) or x.dim() < 2:
            return orig(x, *args, **kwargs)
        rows = x.numel() // max(1, x.shape[-1])
        if rows <= chunk:
            return orig(x)
        trained = [p for p in mlp.parameters() if p.requires_grad]
        if torch.is_grad_enabled() and (x.requires_grad or trained):
            zero3 = [p for p in trained if compat.is_zero3_param(p)]
            if zero3:
                return _TiledMLP.apply(orig, chunk, zero3, x)
            return _TiledMLP.apply(orig, chunk, None, x, *trained)
        flat = x.reshape(-1, x.shape[-1])  # no graph to build: just chunk the forward
        out = None
        for s in range(0, rows, chunk):
            o = orig(flat[s:s + chunk])
            if out is None:
                out = o.new_empty((rows, o.shape[-1]))
            out[s:s + o.shape[0]] = o
        return out.view(*x.shape[:-1], out.shape[-1])

    forward._ropescale_tiled = chunk
    return forward


def decoder_mlps(model) -> list:
    """The MLP module of every decoder layer (``layer.mlp`` of Llama / Qwen2 / Mistral layers)."""
    out = []
    for m in causal_lm_of(model).modules():
        mlp = getattr(m, "mlp", None)
        if isinstance(mlp, torch.nn.Module) and type(m).__name__.endswith(("DecoderLayer", "Block", "Layer")):
            out.append(mlp)
    return out


def enable_tiled_mlp(model, chunk: int) -> int:
    """Compute every decoder layer's MLP over ``chunk``-token chunks (see :class:`_TiledMLP`); chunk 0 restores
    the plain MLP. Returns the number of MLPs changed."""
    mlps = decoder_mlps(model)
    if not mlps and chunk:
        raise InputError(f"--tile-mlp: no decoder layer with an `mlp` module in {type(model).__name__}")
    for mlp in mlps:
        if "_ropescale_own_forward" in mlp.__dict__:  # tiled before: start from the MLP's own forward
            own = mlp.__dict__.pop("_ropescale_own_forward")
            if own is None:
                mlp.__dict__.pop("forward", None)
            else:
                mlp.forward = own
        if chunk:
            mlp._ropescale_own_forward = mlp.__dict__.get("forward")  # None: the class's forward
            mlp.forward = _tiled_forward(mlp, mlp.forward, int(chunk))
    return len(mlps)


def checkpointed_layers(model) -> list:
    """Modules of ``model`` (PEFT / DeepSpeed wrappers looked through) that transformers checkpoints: those with a
    true ``gradient_checkpointing`` attribute (the decoder layers, and in older transformers the decoder)."""
    return compat.checkpointed_modules(causal_lm_of(model))


def innermost_layers(modules: list) -> list:
    """The decoder layers among checkpointed modules: those holding no other one (5.x flags the decoder too)."""
    ids = {id(m) for m in modules}
    return [m for m in modules if not any(id(c) in ids for c in m.modules() if c is not m)]
