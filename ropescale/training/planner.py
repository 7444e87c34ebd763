"""The memory planner: the fastest way to run a training step that fits the device and the host.

A plan says where each part of a step lives and what is recomputed (:class:`Plan`): the frozen weights on the GPU
or offloaded (ZeRO-3 parameter offload), the optimizer state on the GPU or offloaded (DeepSpeed's CPU Adam),
activation recompute of no layer, every k-th layer or every layer, one stored checkpoint per layer or per block of
k layers (the block's upper layers' inputs recomputed from it in backward), stored checkpoints on the GPU up to a
budget and on the host past it, the MLP tiled over sequence chunks or not, and the LM head in chunks under ZeRO-3.
The math of a run never changes (ZeRO-3 stays ZeRO-3, AdamW stays AdamW with its settings): only where tensors
live and what is computed twice.

:func:`choose` enumerates the plans the flags leave open, keeps those whose memory (``memory_model.estimate``) fits
:data:`~ropescale.training.memory_model.FITS_SHARE` of the device's free memory and whose host memory (the
estimate's host bytes + :data:`HOST_BASE`) fits ``memory.HOST_HEADROOM`` of the available host memory, and takes
the one the time model (:func:`step_seconds`) says is fastest; among equally fast ones the cheapest in this order:
weights on the GPU, optimizer on the GPU, less recompute, fewer recomputed blocks, checkpoints on the GPU, no MLP
tiling, the head in one call.

The time model (seconds of one micro-step; constants below, each with where it comes from):

- position-wise work: every matmul of the decoder (frozen weights + LoRA) and of the head, with the elementwise work
  that rides on them, at :data:`RATE_TOKEN` FLOP/s: each forward pass is 2 x parameters x tokens, the backward
  one more (input gradients only: the weights are frozen) plus the LoRA weights' gradients; each recomputed layer
  one more forward, each layer inside a block of k its share of a forward more, a tiled MLP one MLP forward more.
- attention: 2 x T^2 x (heads x head dim) FLOPs per layer per causal forward, backward counted as
  :data:`ATTN_BACKWARD` forwards (FlashAttention's backward recomputes the scores), at :data:`RATE_ATTN`.
- offload: :data:`OFFLOAD_PARAMS_S` per micro-step with the weights offloaded, :data:`OFFLOAD_OPTIMIZER_S` per
  optimizer step with the optimizer offloaded; checkpoints to and from the host at :data:`PCIE_BYTES_S` on a side
  stream, visible only where they take longer than the step's compute.

``python -m ropescale.training.memory_model --plan 524288`` prints the choice for a machine; ``--reach`` the longest
sample each plan reaches.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from .memory_model import FITS_SHARE, GIB, HOST_HEADROOM, Estimate, Setup, Shape, estimate

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
            "lora": 2 * tokens * shape.lora_params(s.lora_r, s.lora_targets),
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
             + f["head"] * head_passes) / RATE_TOKEN
    attn = f["attention"] * (passes + ATTN_BACKWARD) / RATE_ATTN
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
          "gpu_checkpoints", "tile_mlp", "head_chunk_zero3")


@dataclass(frozen=True)
class Plan:
    """Where a step's tensors live and what it recomputes (module doc)."""

    name: str = "fit"  # fit (chosen for the device) | recipe (the config as written, the old auto rules)
    offload_params: bool = True
    offload_optimizer: bool = True
    recompute_every: int = 1
    checkpoint_block: int = 1
    offload_checkpoints: bool = False
    gpu_checkpoints: int = 0
    tile_mlp: int = 0
    head_chunk_zero3: bool = False

    def setup(self, base: Setup) -> Setup:
        return replace(base, offload_param=self.offload_params, offload_optimizer=self.offload_optimizer,
                       recompute_every=self.recompute_every, checkpoint_block=self.checkpoint_block,
                       offload_checkpoints=self.offload_checkpoints, gpu_checkpoints=self.gpu_checkpoints,
                       tile_mlp=self.tile_mlp, head_chunk_zero3=self.head_chunk_zero3,
                       gradient_checkpointing=self.recompute_every > 0)

    def preference(self) -> tuple:
        """Cheapest first (module doc): the order among plans the time model finds equally fast."""
        return (self.offload_params, self.offload_optimizer, RECOMPUTE_CHOICES.index(self.recompute_every)
                if self.recompute_every in RECOMPUTE_CHOICES else 9, self.checkpoint_block,
                self.offload_checkpoints, -self.gpu_checkpoints, self.tile_mlp > 0, self.head_chunk_zero3)

    def describe(self) -> str:
        rec = {0: "no layer recomputed", 1: "every layer recomputed"}.get(self.recompute_every,
                                                                            f"every {self.recompute_every}th layer "
                                                                            "recomputed")
        if self.recompute_every == 1 and self.checkpoint_block > 1:
            rec += f", one checkpoint per {self.checkpoint_block} layers"
        ck = "checkpoints on the GPU"
        if self.offload_checkpoints:
            ck = (f"{self.gpu_checkpoints} checkpoints on the GPU, the rest on the host" if self.gpu_checkpoints
                  else "checkpoints on the host")
        return (f"{self.name}: weights {'offloaded' if self.offload_params else 'on the GPU'}, optimizer "
                f"{'offloaded' if self.offload_optimizer else 'on the GPU'}, {rec}, {ck}, "
                + (f"MLP tiled ({self.tile_mlp})" if self.tile_mlp else "MLP not tiled")
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
             "estimate_gib": {"peak": round(e.peak / GIB, 2), "at": e.at, "weights": round(e.weights / GIB, 2),
                              "state": round(e.state / GIB, 2), "checkpoints": round(e.checkpoints / GIB, 2),
                              "activations": round(e.activations / GIB, 2), "logits": round(e.logits / GIB, 2),
                              "host": round(e.host / GIB, 2), "host_with_base": round(self.host_need / GIB, 2)},
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
            "offload_checkpoints": [False, True], "gpu_checkpoints": [None]}
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
                    for tile in o["tile_mlp"]:
                        for head in o["head_chunk_zero3"]:
                            for off in (o["offload_checkpoints"] if k else [False]):
                                yield Plan(offload_params=p, offload_optimizer=q, recompute_every=k,
                                           checkpoint_block=blk, offload_checkpoints=off,
                                           gpu_checkpoints=o["gpu_checkpoints"][0] if off else 0, tile_mlp=tile,
                                           head_chunk_zero3=head)


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
        raise NoFit(_no_fit_message(base, machine, closest))
    choice = best[1]
    choice.considered, choice.fitting = n, fit
    return choice


def _no_fit_message(base: Setup, machine: Machine, closest) -> str:
    from .memory import gib

    head = f"no memory plan fits {base.tokens:,}-token micro-batches on {machine.name}"
    if closest is None:
        return head + " (no plan is allowed by the flags given)"
    _, plan, e, host = closest
    return (f"{head}: the closest ({plan.describe()}) needs {gib(e.peak)} of GPU memory (budget "
            f"{gib(machine.gpu_budget)}) and {gib(host)} of host memory (budget "
            f"{gib(machine.host_budget + HOST_BASE)}); train on shorter samples, use sequence parallelism over "
            f"more GPUs, or a machine with more memory")


def recipe_plan(base: Setup, shape: Shape, *, cuda: bool) -> Plan:
    """The plan the recipes ran with before the planner: the DeepSpeed config's offload settings as written,
    every layer recomputed, checkpoint offload and MLP tiling from ``memory.AUTO_MIN_TOKENS`` tokens on CUDA, the
    head in one call under ZeRO-3."""
    from .memory import AUTO_MIN_TOKENS

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


# ---------------------------------------------------------------- reach: the longest sample a plan family fits
@dataclass(frozen=True)
class Family:
    """A family of plans for :func:`reach`: the planner restricted to some choices."""

    name: str
    fixed: dict = field(default_factory=dict)


FAMILIES = (
    Family("recipe: weights + optimizer offloaded, every checkpoint on the host", {"recipe": True}),
    Family("every layer recomputed, checkpoints on the GPU then the host", {"recompute_every": 1,
                                                                            "checkpoint_block": 1}),
    Family("+ one checkpoint per 2 layers", {"recompute_every": 1, "checkpoint_block": 2}),
    Family("+ one checkpoint per 4 layers", {"recompute_every": 1, "checkpoint_block": 4}),
    Family("the planner, every choice open", {}),
)


def fits(shape: Shape, base: Setup, machine: Machine, fixed: dict) -> Choice | None:
    fixed = dict(fixed)
    if fixed.pop("recipe", False):
        c = evaluate(recipe_plan(base, shape, cuda=True), shape, base, machine)
        ok = c.estimate.peak <= machine.gpu_budget and c.estimate.host <= machine.host_budget
        return c if ok else None
    try:
        return choose(shape, base, machine, fixed)
    except NoFit:
        return None


def reach(shape: Shape, machine: Machine, family: Family, *, step: int = 16384, base: Setup | None = None,
          limit: int = 1 << 22) -> tuple[int, Choice | None]:
    """The longest sample (a multiple of ``step`` up to ``limit``) some plan of ``family`` fits on ``machine``."""
    base = base or Setup(length=step)

    def at(n: int) -> Choice | None:
        return fits(shape, replace(base, length=n * step), machine, family.fixed)

    if at(1) is None:
        return 0, None
    lo, hi = 1, 2
    while hi * step <= limit and at(hi) is not None:
        lo, hi = hi, hi * 2
    hi = min(hi, limit // step + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) is not None else (lo, mid)
    return lo * step, at(lo)
