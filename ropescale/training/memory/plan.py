"""The memory planner: the fastest way to run a training step that fits the device and the host.

A plan says where each part of a step lives and what is recomputed (:class:`Plan`): the frozen weights on the GPU
or offloaded (ZeRO-3 parameter offload), the optimizer state on the GPU or offloaded (DeepSpeed's CPU Adam),
activation recompute of no layer, every k-th layer or every layer, one stored checkpoint per layer or per block of
k layers (the block's upper layers' inputs recomputed from it in backward), stored checkpoints on the GPU up to a
budget and on the host past it, the MLP tiled over sequence chunks or not, and the LM head in chunks under ZeRO-3.
The math of a run never changes (ZeRO-3 stays ZeRO-3, AdamW stays AdamW with its settings): only where tensors
live and what is computed twice.

:func:`choose` enumerates the plans the flags leave open, keeps those whose memory (``estimate.estimate``) fits
:data:`~ropescale.training.memory.estimate.FITS_SHARE` of the device's free memory and whose host memory (the
estimate's host bytes + :data:`HOST_BASE`) fits ``estimate.HOST_HEADROOM`` of the available host memory, and takes
the one the time model (:func:`step_seconds`) says is fastest; among equally fast ones the cheapest in this order:
weights on the GPU, optimizer on the GPU, less recompute, fewer recomputed blocks, checkpoints on the GPU, no MLP
tiling, the head in one call.

The time model (seconds of one micro-step; constants below, each with where it comes from):

- position-wise work: every matmul of the decoder (frozen weights + LoRA) and of the head, with the elementwise work
  that rides on them, at :data:`RATE_TOKEN` FLOP/s: each forward pass is 2 x parameters x tokens, the backward
  one more (input gradients only: the weights are frozen) plus the LoRA weights' gradients; each recomputed layer
  one more forward, each layer inside a block of k its share of a forward more, a tiled MLP one MLP forward more,
  a layer tiled by sequence (``tiled_attention``) one forward of its key / value projections more.
- attention: 2 x T^2 x (heads x head dim) FLOPs per layer per causal forward, backward counted as
  :data:`ATTN_BACKWARD` forwards (FlashAttention's backward recomputes the scores), at :data:`RATE_ATTN`
  (:data:`RATE_ATTN_TILED`, SDPA's FlashAttention-2 kernel, in a layer tiled by sequence).
- offload: :data:`OFFLOAD_PARAMS_S` per micro-step with the weights offloaded, :data:`OFFLOAD_OPTIMIZER_S` per
  optimizer step with the optimizer offloaded; checkpoints to and from the host at :data:`PCIE_BYTES_S` on a side
  stream, visible only where they take longer than the step's compute.

``python -m ropescale.training.memory --plan 524288`` prints the choice for a machine; ``--reach`` the longest
sample each plan reaches.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ropescale.common.forward_memory import GIB, Shape

from .estimate import (
    AUTO_MIN_TOKENS,
    FITS_SHARE,
    HOST_HEADROOM,
    Activations,
    Estimate,
    Setup,
    estimate,
    lora_params,
    ordinal,
)

# ---------------------------------------------------------------- the time model's constants
# RATE_TOKEN, RATE_ATTN: the no-ZeRO path (bench/gpu_train_step.py: weights and optimizer on the GPU, every layer
# recomputed, SDPA) on one H100 80GB, 2026-11-22/23 (docs/measurements.md): 16K in 16384 / 6790 = 2.413 s, 32K in
# 32768 / 5587 = 5.865 s. Position-wise FLOPs (3 forwards' worth + LoRA gradients + head) and attention FLOPs (4.5
# forwards' worth: forward, recompute, backward 2.5) of those two steps give two equations in the two rates
# (tests/test_memory_planner.py solves them again). An H200 has the H100's arithmetic and faster memory: on it these
# rates are, if anything, low (the plans' predicted times high).
RATE_TOKEN = 339e12
RATE_ATTN = 609e12
ATTN_BACKWARD = 2.5
# RATE_ATTN_TILED: attention of a layer tiled by sequence (tiled_attention): a query chunk over the keys up to its end
# takes SDPA's lower-right causal mask, which torch (2.13, torch.nn.attention.bias.CausalBias) runs with SDPA's
# FlashAttention-2 kernel (else the memory-efficient one), not cuDNN's. RATE_ATTN x cuDNN's time against that
# kernel's on one causal forward + backward at 16K on the H200 (docs/gpu/suite-h200-2026-11-27-plan.json, env step:
# cuDNN 13.07 ms, FlashAttention-2 24.449 ms); not measured on a tiled step (an assumption: the same ratio).
RATE_ATTN_TILED = RATE_ATTN * 13.07 / 24.449
# OFFLOAD_*: the recipe path (ZeRO-3, weights + optimizer offloaded, every layer recomputed) on one H200 at 16K,
# 2026-11-26 (docs/gpu/suite-h200-2026-11-26.json): 16384 / 5864.7 = 2.794 s, 0.38 s more than the model above says
# the same step takes without offload. The two offloads cannot be told apart from that one figure: each is charged
# half (an assumption; it orders only plans that offload exactly one of them).
OFFLOAD_PARAMS_S = 0.19
OFFLOAD_OPTIMIZER_S = 0.19
# PCIE_BYTES_S: host <-> GPU copies of pinned pages on PCIe 5.0 x16 (an assumption: a third of the link's 64 GB/s
# each way; checkpoint copies overlap the compute, so it matters only where they would outlast it).
PCIE_BYTES_S = 25e9
# HOST_BASE: host memory of the recipe path beyond what the memory model counts (offloaded weights + optimizer +
# checkpoints): process, libraries, CUDA context, DeepSpeed's buffers. Peak RSS minus the model's host bytes on one
# H200 (docs/gpu/suite-h200-2026-11-27.json): 35.8 - 23.8 at 16K, 67.4 - 55.8 at 128K, 99.4 - 87.8 at 256K GiB.
HOST_BASE = 12 * GIB
# the dense bf16 peak of a card (the datasheets, SXM parts): MFU's denominator
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}

RECOMPUTE_CHOICES = (0, 4, 3, 2, 1)  # every k-th layer (0: none), cheapest first
BLOCK_CHOICES = (1, 2, 4, 8)  # one stored checkpoint per k layers (with every layer recomputed)


def peak_flops(device: str | None) -> float | None:
    """The dense bf16 peak of a card named ``device`` (``NVIDIA H200``, ``NVIDIA H100 80GB HBM3``), or None."""
    name = (device or "").upper()
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


# ---------------------------------------------------------------- FLOPs
def step_flops(shape: Shape, s: Setup) -> dict:
    """FLOPs of one micro-batch's forward, by kind: the decoder's matmuls (frozen weights), LoRA's, the MLP's share
    of the decoder's, attention (causal: 2 x T^2 x q per layer), the head on the labelled positions."""
    t = s.tokens // s.micro_batch  # attention is per sample
    tokens = s.tokens
    labelled = math.ceil(s.label_share * tokens)
    mlp = 3 * shape.hidden * shape.intermediate
    return {"matmul": 2 * tokens * shape.layers * shape.layer_params(),
            "mlp": 2 * tokens * shape.layers * mlp,
            "key_value": 2 * tokens * shape.layers * 2 * shape.hidden * shape.kv,
            "lora": 2 * tokens * lora_params(shape, s.lora_r, s.lora_targets),
            "attention": s.micro_batch * shape.layers * 2 * t * t * shape.q,
            "head": 2 * labelled * shape.vocab * shape.hidden}


def model_flops(shape: Shape, s: Setup) -> float:
    """The step's model FLOPs, MFU's numerator: forward (decoder matmuls + LoRA + attention + head) and backward
    (input gradients through every matmul and the head, LoRA's weight gradients, attention's backward as 2
    forwards); the frozen weights get no gradient, and recompute is not counted."""
    f = step_flops(shape, s)
    return 2 * f["matmul"] + 3 * f["lora"] + 3 * f["attention"] + 2 * f["head"]


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops`` / ``seconds`` / the card's peak (None without a peak)."""
    if not peak or not seconds or seconds <= 0:
        return None
    return flops / seconds / peak


def step_seconds(shape: Shape, s: Setup, *, accum: int = 1) -> dict:
    """The time model (module doc): seconds of one optimizer step of ``accum`` micro-steps, by part."""
    f = step_flops(shape, s)
    layers = shape.layers
    recomputed = s.recomputed_layers(layers)
    passes = 1 + recomputed / layers  # forward + recompute
    if s.recompute_every == 1 and s.checkpoint_block > 1:
        passes += (s.checkpoint_block - 1) / s.checkpoint_block  # a block's upper inputs, recomputed from its own
    labelled = math.ceil(s.label_share * s.tokens)
    chunked = labelled > s.head_chunk and (s.zero != 3 or s.head_chunk_zero3)
    head_passes = 3 if chunked else 2  # chunks are checkpointed: their forward runs again in backward
    token = (f["matmul"] * (passes + 1) + f["lora"] * (passes + 2) + (f["mlp"] if s.tile_mlp else 0)
             + (f["key_value"] if s.tile_attention else 0) + f["head"] * head_passes) / RATE_TOKEN
    attn = f["attention"] * (passes + ATTN_BACKWARD) / (RATE_ATTN_TILED if s.tile_attention else RATE_ATTN)
    compute = token + attn
    est = estimate(shape, s)
    host_ckpt = est.parts["host_checkpoints"] * est.parts["checkpoint_bytes"]
    copies = max(0.0, 2 * host_ckpt / PCIE_BYTES_S - compute)
    params = OFFLOAD_PARAMS_S if s.zero == 3 and s.offload_param else 0.0
    optim = OFFLOAD_OPTIMIZER_S if s.zero and s.offload_optimizer else 0.0
    micro = compute + copies + params
    return {"token": token, "attention": attn, "checkpoint_copies": copies, "offload_params": params,
            "offload_optimizer": optim, "micro_step": micro, "step": accum * micro + optim}


# ---------------------------------------------------------------- plans
@dataclass(frozen=True)
class Machine:
    """What a plan must fit: the device's free memory and the host's available memory (bytes)."""

    name: str
    gpu_bytes: int
    host_bytes: int

    @property
    def gpu_budget(self) -> int:
        return int(FITS_SHARE * self.gpu_bytes)

    @property
    def host_budget(self) -> int:
        """Host bytes the memory model's host figure may reach: HOST_HEADROOM of the available, less HOST_BASE."""
        return int(HOST_HEADROOM * self.host_bytes) - HOST_BASE


H200 = Machine("one H200 (139.8 GiB) + 125 GiB host", int(139.8 * GIB), 125 * GIB)
H100 = Machine("one H100 80GB (79.6 GiB) + 125 GiB host", int(79.6 * GIB), 125 * GIB)

FIELDS = ("offload_params", "offload_optimizer", "recompute_every", "checkpoint_block", "offload_checkpoints",
          "gpu_checkpoints", "tile_mlp", "head_chunk_zero3", "tile_attention")


@dataclass(frozen=True)
class Plan(Activations):
    """Where a step's tensors live and what it recomputes (module doc): the activations (:class:`Activations`),
    where the parameters and the optimizer state live, the LM head's chunking under ZeRO-3."""

    name: str = "fit"  # fit (chosen for the device) | recipe (the config as written, the old auto rules)
    offload_params: bool = True
    offload_optimizer: bool = True
    head_chunk_zero3: bool = False

    def setup(self, base: Setup) -> Setup:
        return replace(base, offload_param=self.offload_params, offload_optimizer=self.offload_optimizer,
                       recompute_every=self.recompute_every, checkpoint_block=self.checkpoint_block,
                       offload_checkpoints=self.offload_checkpoints, gpu_checkpoints=self.gpu_checkpoints,
                       tile_mlp=self.tile_mlp, head_chunk_zero3=self.head_chunk_zero3,
                       tile_attention=self.tile_attention, gradient_checkpointing=self.recompute_every > 0)

    def preference(self) -> tuple:
        """Cheapest first (module doc): the order among plans the time model finds equally fast."""
        return (self.offload_params, self.offload_optimizer, RECOMPUTE_CHOICES.index(self.recompute_every)
                if self.recompute_every in RECOMPUTE_CHOICES else 9, self.checkpoint_block,
                self.offload_checkpoints, -self.gpu_checkpoints, self.tile_mlp > 0, self.tile_attention > 0,
                self.head_chunk_zero3)

    def describe(self) -> str:
        rec = {0: "no layer recomputed", 1: "every layer recomputed"}.get(self.recompute_every,
                                                                            f"every {ordinal(self.recompute_every)} "
                                                                            "layer recomputed")
        if self.recompute_every == 1 and self.checkpoint_block > 1:
            rec += f", one checkpoint per {self.checkpoint_block} layers"
        ck = "checkpoints on the device"
        if self.offload_checkpoints:
            n = self.gpu_checkpoints
            ck = (f"{n} checkpoint{'s' if n > 1 else ''} on the device, the rest on the host" if n
                  else "checkpoints on the host")
        return (f"{self.name}: weights {'offloaded' if self.offload_params else 'on the device'}, optimizer "
                f"{'offloaded' if self.offload_optimizer else 'on the device'}, {rec}, {ck}, "
                + (f"layer tiled by sequence ({self.tile_attention})" if self.tile_attention else
                   f"MLP tiled ({self.tile_mlp})" if self.tile_mlp else "MLP not tiled")
                + (", head chunked" if self.head_chunk_zero3 else ""))


@dataclass
class Choice:
    """A plan with the memory model's and the time model's numbers behind it."""

    plan: Plan
    estimate: Estimate
    seconds: dict
    machine: Machine | None = None
    considered: int = 0
    fitting: int = 0
    host_need: int = 0

    def record(self) -> dict:
        """What run.json keeps (GiB and seconds rounded)."""
        e = self.estimate
        r = {"plan": asdict(self.plan), "describe": self.plan.describe(),
             "estimate_gib": {k: round(v / GIB, 4) for k, v in (
                 ("peak", e.peak), ("weights", e.weights), ("state", e.state), ("checkpoints", e.checkpoints),
                 ("activations", e.activations), ("logits", e.logits), ("host", e.host),
                 ("host_with_base", self.host_need))} | {"at": e.at},
             "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
             "considered": self.considered, "fitting": self.fitting}
        if self.machine is not None:
            r["machine"] = {"name": self.machine.name, "gpu_gib": round(self.machine.gpu_bytes / GIB, 2),
                            "host_gib": round(self.machine.host_bytes / GIB, 2),
                            "gpu_budget_gib": round(self.machine.gpu_budget / GIB, 2),
                            "host_budget_gib": round(self.machine.host_budget / GIB, 2)}
        return r


class NoFit(Exception):
    """No plan the flags allow fits the machine: the message says by how much the closest one misses."""


def _options(base: Setup, shape: Shape, fixed: dict) -> dict:
    """The values each choice may take: the flag's where given, else those the run's set-up allows."""
    zero3 = base.zero == 3
    opts = {"offload_params": [False, True] if zero3 else [False],
            "offload_optimizer": [False, True] if base.zero in (2, 3) else [False],
            "recompute_every": list(RECOMPUTE_CHOICES) if base.gradient_checkpointing else [0],
            "checkpoint_block": list(BLOCK_CHOICES),
            "tile_mlp": [0, shape.hidden],
            "head_chunk_zero3": [False, True] if (zero3 and base.world == 1) else [False],
            "offload_checkpoints": [False, True], "gpu_checkpoints": [None],
            "tile_attention": [0, shape.hidden] if base.sp == 1 else [0]}  # not composed with Ulysses (yet)
    for k, v in fixed.items():
        if v is not None and k in opts:
            opts[k] = [v]
    return opts


def _candidates(base: Setup, shape: Shape, fixed: dict):
    o = _options(base, shape, fixed)
    for p in o["offload_params"]:
        for q in o["offload_optimizer"]:
            for k in o["recompute_every"]:
                for blk in (o["checkpoint_block"] if k == 1 else [1]):
                    for tile, ta in _tiles(o, k):
                        for head in o["head_chunk_zero3"]:
                            for off in (o["offload_checkpoints"] if k else [False]):
                                yield Plan(offload_params=p, offload_optimizer=q, recompute_every=k,
                                           checkpoint_block=blk, offload_checkpoints=off,
                                           gpu_checkpoints=o["gpu_checkpoints"][0] if off else 0, tile_mlp=tile,
                                           head_chunk_zero3=head, tile_attention=ta)


def _tiles(o: dict, k: int):
    """(tile_mlp, tile_attention) pairs: the layer tiled by sequence only with every layer recomputed (its MLP
    then runs per chunk: no MLP tiling beside it)."""
    if 0 in o["tile_attention"]:  # not where --tile-attention N is fixed by hand
        yield from ((t, 0) for t in o["tile_mlp"])
    if k == 1 and 0 in o["tile_mlp"]:  # not where --tile-mlp N is fixed by hand
        yield from ((0, ta) for ta in o["tile_attention"] if ta)


def _place(plan: Plan, base: Setup, shape: Shape, machine: Machine) -> Plan | None:
    """An offloading plan with as many stored checkpoints on the GPU as its budget holds; None where offloading
    gains nothing (what stays on the GPU would hold them all: two are in flight while any is on the host)."""
    if not plan.offload_checkpoints or plan.gpu_checkpoints is not None:
        return plan
    first = replace(plan, gpu_checkpoints=0)
    s0 = first.setup(base)
    stored = s0.stored_checkpoints(shape.layers)
    e = estimate(shape, s0)
    room = machine.gpu_budget - (e.weights + e.state + max(e.parts["moments"]["head"], e.parts["moments"]["layer"]))
    per = s0.tokens * shape.hidden * base.dtype_bytes
    kept = max(0, room // per)
    if kept >= stored - 2:
        return None
    return replace(plan, gpu_checkpoints=int(kept))


def choose(shape: Shape, base: Setup, machine: Machine, fixed: dict | None = None, *, accum: int = 1) -> Choice:
    """The fastest plan (module doc) for a step of ``base`` (the run's shape-independent settings: length, ZeRO
    stage, LoRA, ...) on ``machine``; ``fixed``: the choices given by hand ({field: value}, None = open). Raises
    :class:`NoFit`."""
    fixed = dict(fixed or {})
    best, n, fit, closest = None, 0, 0, None
    for cand in _candidates(base, shape, fixed):
        plan = _place(cand, base, shape, machine)
        if plan is None:
            continue
        n += 1
        s = plan.setup(base)
        e = estimate(shape, s)
        host = e.host + HOST_BASE
        over = max(e.peak - machine.gpu_budget, 0) + max(e.host - machine.host_budget, 0)
        if over > 0:
            if closest is None or over < closest[0]:
                closest = (over, plan, e, host)
            continue
        fit += 1
        sec = step_seconds(shape, s, accum=accum)
        key = (round(sec["step"], 3), plan.preference())
        if best is None or key < best[0]:
            best = (key, Choice(plan, e, sec, machine, host_need=host))
    if best is None:
        err = NoFit(_no_fit_message(base, machine, closest))
        err.closest = closest  # (bytes over, plan, estimate, host bytes) or None
        raise err
    choice = best[1]
    choice.considered, choice.fitting = n, fit
    return choice


def _no_fit_message(base: Setup, machine: Machine, closest) -> str:
    g = lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    head = f"no memory plan fits {base.tokens:,}-token micro-batches on {machine.name}"
    if closest is None:
        return head + " (no plan is allowed by the flags given)"
    _, plan, e, host = closest
    return (f"{head}: the closest ({plan.describe()}) needs {g(e.peak)} of GPU memory (budget "
            f"{g(machine.gpu_budget)}) and {g(host)} of host memory (budget {g(machine.host_budget + HOST_BASE)}); "
            f"train on shorter samples, use sequence parallelism over more GPUs, or a machine with more memory")


def recipe_plan(base: Setup, shape: Shape, *, cuda: bool) -> Plan:
    """The plan the recipes ran with before the planner: the DeepSpeed config's offload settings as written,
    every layer recomputed, checkpoint offload and MLP tiling from ``estimate.AUTO_MIN_TOKENS`` tokens on CUDA, the
    head in one call under ZeRO-3."""
    long_ = cuda and base.tokens >= AUTO_MIN_TOKENS
    return Plan(name="recipe", offload_params=base.zero == 3 and base.offload_param,
                offload_optimizer=bool(base.zero) and base.offload_optimizer,
                recompute_every=1 if base.gradient_checkpointing else 0,
                offload_checkpoints=long_ and base.gradient_checkpointing, tile_mlp=shape.hidden if long_ else 0)


def evaluate(plan: Plan, shape: Shape, base: Setup, machine: Machine | None = None, *, accum: int = 1) -> Choice:
    """A given plan's numbers (the recipe plan, or a plan fixed entirely by hand)."""
    s = plan.setup(base)
    e = estimate(shape, s)
    return Choice(plan, e, step_seconds(shape, s, accum=accum), machine, considered=1, fitting=1,
                  host_need=e.host + HOST_BASE)


# ---------------------------------------------------------------- a finetune run's plan
TRI = {"true": True, "false": False, "auto": None}


def machine_here(cuda: bool, *, device_gib: float | None = None, host_gib: float | None = None) -> Machine:
    """This machine: the device's free memory (``device_gib`` instead where given; on CPU the host's available
    memory) and the host's available memory (``host_gib``), split between the processes of this node."""
    import os

    from ropescale.common.host import available_host_bytes

    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    host = int(host_gib * GIB) if host_gib else available_host_bytes() // local
    name = "cpu"
    if cuda:
        import torch

        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        name = torch.cuda.get_device_name()
    gpu = int(device_gib * GIB) if device_gib else (free if cuda else host)
    return Machine(f"{name} ({gpu / GIB:.1f} GiB free) + {host / GIB:.1f} GiB host", gpu, host)


def fixed_choices(settings, base: Setup) -> dict:
    """The choices ``settings`` (TrainSettings) fix by hand ({field: value}; None = the planner's), checked
    against the run's set-up (InputError)."""
    from ropescale.common.io import InputError

    f = {"offload_params": TRI[settings.offload_params], "offload_optimizer": TRI[settings.offload_optimizer],
         "recompute_every": settings.recompute_every, "checkpoint_block": settings.checkpoint_block,
         "gpu_checkpoints": settings.gpu_checkpoints, "offload_checkpoints": TRI[settings.offload_checkpoints],
         "tile_mlp": settings.tile_mlp, "head_chunk_zero3": TRI[settings.chunk_head],
         "tile_attention": getattr(settings, "tile_attention", None)}
    if not settings.gradient_checkpointing:
        if f["recompute_every"]:
            raise InputError("--recompute-every needs --gradient-checkpointing true")
        f["recompute_every"] = 0
    if f["offload_params"] and base.zero != 3:
        raise InputError("--offload-params true needs ZeRO-3 (--deepspeed zero3 or zero3_offload)")
    if f["offload_optimizer"] and base.zero not in (2, 3):
        raise InputError("--offload-optimizer true needs ZeRO-2 or ZeRO-3 (--deepspeed zero2, zero3, ...)")
    if f["head_chunk_zero3"] and (base.zero != 3 or base.world > 1):
        raise InputError("--chunk-head true is for ZeRO-3 in one process (elsewhere the head is chunked anyway, or "
                         "must run in one call)")
    if f["offload_checkpoints"] and f["recompute_every"] == 0:
        raise InputError("--offload-checkpoints true needs recomputed layers (--recompute-every >= 1)")
    return f


def own_or(given, own):
    """A flag's value where given (not None), else the plan's own."""
    return own if given is None else given


def plan_for_run(config, settings, *, cuda: bool, world: int, ds_config: dict | None, length: int,
                 label_share: float, dtype_bytes: int, accum: int = 1, previous: dict | None = None) -> Choice:
    """A finetune run's memory plan (``--memory-plan``): ``fit`` = :func:`choose` on this machine with the
    choices the flags fix (a resume keeps its run's weight and optimizer placement unless the flags say), raising
    InputError in one line when nothing fits; ``recipe`` = :func:`recipe_plan` with the flags' activation choices
    (``install.plan_from_args``), evaluated."""
    from ropescale.common.io import InputError

    from .estimate import run_setup
    from .install import plan_from_args

    shape, base = run_setup(config, settings, length=length, label_share=label_share, world=world,
                            ds_config=ds_config, dtype_bytes=dtype_bytes)
    machine = machine_here(cuda, device_gib=settings.device_memory_gib, host_gib=settings.host_memory_gib)
    mode = settings.memory_plan if settings.memory_plan != "auto" else ("fit" if cuda else "recipe")
    fixed = fixed_choices(settings, base)
    if mode == "recipe":
        acts = plan_from_args(settings, cuda=cuda, tokens=base.tokens, hidden=shape.hidden)
        own = recipe_plan(base, shape, cuda=cuda)
        keep = lambda k: own_or(fixed[k], getattr(own, k))  # noqa: E731
        plan = Plan(name="recipe", **asdict(acts), offload_params=keep("offload_params"),
                    offload_optimizer=keep("offload_optimizer"), head_chunk_zero3=bool(fixed["head_chunk_zero3"]))
        return evaluate(plan, shape, base, machine, accum=accum)
    for key in ("offload_params", "offload_optimizer"):
        was = ((previous or {}).get("plan") or {}).get(key)
        if fixed[key] is None and was is not None:
            fixed[key] = bool(was)
    try:
        return choose(shape, base, machine, fixed, accum=accum)
    except NoFit as e:
        raise InputError(str(e)) from None


def ds_config_dict(path, *, cuda: bool, cpu_adam: str, offload: tuple[bool, bool] | None = None) -> dict:
    """The DeepSpeed JSON with what this machine needs: ``offload`` (the memory plan's (weights, optimizer) to the
    host or not) written into its ZeRO section; no pinned memory on CPU; with optimizer offload either
    DeepSpeedCPUAdam (an ``optimizer`` section, "auto" values from HF) or torch AdamW
    (``zero_force_ds_cpu_optimizer: false``)."""
    from ropescale.common.io import InputError, read_json

    cfg = read_json(path, "DeepSpeed config")
    zo = cfg.get("zero_optimization", {})
    if offload is not None:
        stage = int(zo.get("stage", 0))
        for key, on, stages in (("offload_param", offload[0], (3,)), ("offload_optimizer", offload[1], (2, 3))):
            if stage in stages:
                zo[key] = {"device": "cpu", "pin_memory": True} if on else {"device": "none"}
    offload = zo.get("offload_optimizer", {}).get("device", "none") not in ("none", None)
    if not cuda:
        for k in ("offload_optimizer", "offload_param"):
            if isinstance(zo.get(k), dict):
                zo[k]["pin_memory"] = False
    use_cpu_adam = {"auto": cuda, "true": True, "false": False}.get(str(cpu_adam).lower())
    if use_cpu_adam is None:
        raise InputError(f"--ds-cpu-adam must be auto, true or false, not {cpu_adam!r}")
    if offload and use_cpu_adam:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                                "weight_decay": "auto"}})
    elif offload:
        cfg.pop("optimizer", None)
        cfg["zero_force_ds_cpu_optimizer"] = False
    return cfg


# ---------------------------------------------------------------- the command line
