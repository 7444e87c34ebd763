"""The GPU suite's plan: its steps in order, the sets ``--only`` takes, and each step's expected seconds.

Part of ``bench/gpu_suite.py`` (see its doc): this module only says what runs; ``runner`` runs it and ``table``
prints it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.py"

K = 1024
RECIPE_LENGTHS = (16 * K, 32 * K, 64 * K, 128 * K, 256 * K, 512 * K)
NOZERO_LENGTHS = (16 * K, 32 * K)
GEN_SUBSETS = ("L", "XL", "2XL", "3XL")
DRY_DIV = 256  # the dry run's lengths: the nominal ones / 256
FIT_LENGTH = 512 * K  # the cut models' length (the MLP-tiled recompute: 1M fits only with the layer tiled by sequence)
TILED_LENGTH = 1024 * K  # tiled-1m-2l: the 7B shape cut to 2 layers, one 1M step with each layer tiled by sequence
TILED_FLAGS = ("--memory-plan=fit", "--offload-params=false", "--offload-optimizer=true", "--recompute-every=1",
               "--checkpoint-block=1", "--offload-checkpoints=false", "--tile-mlp=0", "--chunk-head=true")
FIT_LAYERS = (2, 4)
# the fit steps' plan, the same for both cuts so that their peaks differ by the layers alone: the weights on the GPU,
# the optimizer offloaded, every layer recomputed, every checkpoint on the GPU, the MLP tiled, the head in chunks
FIT_FLAGS = ("--memory-plan=fit", "--offload-params=false", "--offload-optimizer=true", "--recompute-every=1",
             "--checkpoint-block=1", "--offload-checkpoints=false", "--tile-mlp=4096", "--chunk-head=true")
OLD_FLAGS = ("--memory-plan=recipe", "--sdpa-backend=default")  # the plan every recipe ran with before the planner
NEW_FLAGS = ("--memory-plan=fit",)  # the planner's plan and the measured attention kernel (the defaults on CUDA)
# --only also takes these sets (in this order): what one command of ~9 minutes should run first on a fresh machine,
# then what a second one continues with (docs/gpu.md: the budget of one lent GPU)
SETS = {"first": ("env", "prepare", "recipe-16k", "plan-16k", "plan-128k"),
        "second": ("plan-32k", "plan-64k", "plan-256k", "fit-2l", "fit-4l", "plan-512k"),
        # the next GPU session's two calls (docs/gpu.md): the open figures, then the real model
        "next1": ("env", "prepare", "plan-256k", "fit-2l"),
        "next2": ("fit-4l", "smollm2-yarn-x2", "smollm2-ntk-x2", "smollm2-pi-x2", "smollm2-yarn-x4",
                  "smollm2-ntk-x4", "smollm2-pi-x4", "tiled-1m-2l", "plan-512k")}
SMOLLM2_METHODS = ("pi", "ntk", "yarn")
SMOLLM2_SCALES = (2, 4)  # x2 at 16,384 tokens, x4 at 32,768 (SmolLM2's window: 8,192)
SMOLLM2_S = {2: 90.0, 4: 120.0}  # expected seconds on an H200: an assumption (start-up, 20 steps, merge, reading)


def short(n: int) -> str:
    """16384 -> 16K."""
    return f"{n // K}K" if n % K == 0 else str(n)


@dataclass(frozen=True)
class Step:
    """One step: what it runs and how its outcome is read."""

    name: str
    group: str  # an out-of-memory or timed-out step skips the later steps of its group
    title: str
    kind: str  # how its output is read: env | prepare | train_path | train_step | generate
    tokens: int = 0  # the nominal length (16384 for 16K, also in the dry run): --fake-oom-above compares it
    run_tokens: int = 0  # what it actually runs (nominal / DRY_DIV in the dry run)
    args: tuple = ()  # script + flags, run with this Python
    timeout_flag: str = ""  # the script's own time limit, set a little inside the step's bound
    needs: tuple = ()  # "cuda", "flash_attn": skipped with why where missing
    info: dict = field(default_factory=dict, hash=False, compare=False)


def plan(workdir: Path, dry: bool) -> list[Step]:
    """The steps in order (see gpu_suite's doc)."""
    return [*_setup_steps(workdir, dry), *_train_steps(workdir, dry, "recipe"), *_train_steps(workdir, dry, "plan"),
            *_fit_steps(workdir, dry), *_nozero_steps(dry), *_gen_steps(dry), _fa2_step(dry),
            *_smollm2_steps(workdir, dry)]


def _scaled(n: int, dry: bool) -> int:
    return n // DRY_DIV if dry else n


def _self(step: str, workdir: Path, dry: bool) -> tuple:
    return (str(SUITE), "--_step", step, "--workdir", str(workdir)) + (("--dry-run",) if dry else ())


def _setup_steps(workdir: Path, dry: bool) -> list[Step]:
    return [Step("env", "env", "environment, attention kernels + bf16 smoke check of the memory paths", "env",
                 args=_self("env", workdir, dry)),
            Step("prepare", "prepare", f"random {'toy' if dry else '7B (Qwen1.5 shape)'} bf16 model written to "
                 "DIR/train", "prepare", args=_self("prepare", workdir, dry))]


def model_shape(dry: bool) -> str:
    """bench_train_path's --shape of the written model."""
    return "toy" if dry else "7b"


def train_steps_at(n: int) -> int:
    """Optimizer steps of a length (2 warm-up steps, then steady ones; fewer where a step takes minutes)."""
    return 4 if n <= 64 * K else 3 if n <= 128 * K else 1


def _train_args(workdir: Path, dry: bool, shape: str, m: int, steps: int, flags) -> list[str]:
    args = [str(ROOT / "bench" / "bench_train_path.py"), "--shape", shape, "--lengths", str(m), "--workdir",
            str(workdir / "train"), "--steps", str(steps), "--json", *(f"--ft-arg={f}" for f in flags)]
    if dry:
        args += ["--launcher", "python"]  # the launcher process alone costs seconds of imports per step
    return args


def _train_steps(workdir: Path, dry: bool, which: str) -> list[Step]:
    """``recipe-N``: the recipe path as it ran before the planner (the old plan); ``plan-N``: the same command with
    the planner's plan and the measured attention kernel."""
    steps = []
    for n in RECIPE_LENGTHS:
        m = _scaled(n, dry)
        flags = list(OLD_FLAGS if which == "recipe" else NEW_FLAGS)
        if n > 256 * K:
            flags.append("--scale=16")  # NTK x8 reaches 262,144 tokens; x16 524,288
        count = 2 if dry else (train_steps_at(n) if which == "plan" else 4 if n <= 128 * K else 3 if n <= 256 * K
                               else 2)
        what = ("recipe path, the old plan (ZeRO-3, weights + optimizer offloaded, every layer recomputed)"
                if which == "recipe" else "recipe path, the planner's plan + measured attention kernel")
        steps.append(Step(f"{which}-{short(n).lower()}", which, f"{what} {short(n)}", "train_path", n, m,
                          tuple(_train_args(workdir, dry, model_shape(dry), m, count, flags)), "--timeout",
                          info={"plan": which, "steps": count}))
    return steps


def _fit_steps(workdir: Path, dry: bool) -> list[Step]:
    """The 7B shape cut to 2 and 4 layers, one step each at :data:`FIT_LENGTH` with the same plan: the measured
    peaks' per-layer slope and constant against the memory model's."""
    steps = []
    for layers in FIT_LAYERS:
        m = _scaled(FIT_LENGTH, dry)
        shape = f"{model_shape(dry)}-{layers}l"
        flags = [*FIT_FLAGS, "--scale=16"]
        steps.append(Step(f"fit-{layers}l", "fit", f"7B shape cut to {layers} layers at {short(FIT_LENGTH)}, one "
                          "step (the memory model's per-layer slope and constant)", "train_path", FIT_LENGTH, m,
                          tuple(_train_args(workdir, dry, shape, m, 1, flags)), "--timeout",
                          info={"plan": "fit", "layers": layers, "steps": 1,
                                "dry_real": dry and layers == FIT_LAYERS[0]}))  # the dry run runs one cut for real
    m = _scaled(TILED_LENGTH, dry)
    flags = [*TILED_FLAGS, f"--tile-attention={m // 64 if dry else 4096}", "--scale=32"]  # NTK x32: 1M
    steps.append(Step("tiled-1m-2l", "tiled", f"7B shape cut to 2 layers at {short(TILED_LENGTH)}, one step, each "
                      "layer tiled by sequence (4,096-token chunks)", "train_path", TILED_LENGTH, m,
                      tuple(_train_args(workdir, dry, f"{model_shape(dry)}-2l", m, 1, flags)), "--timeout",
                      info={"plan": "fit", "layers": 2, "steps": 1, "tile_attention": 4096}))
    return steps


def _nozero_steps(dry: bool) -> list[Step]:
    steps = []
    for n in NOZERO_LENGTHS:
        m = _scaled(n, dry)
        args = [str(ROOT / "bench" / "gpu_train_step.py"), "--seq", str(m), "--baseline", "--attn", "sdpa", "--json"]
        args += ["--toy", "--warmup", "1", "--steps", "1", "--in-process"] if dry else []
        steps.append(Step(f"nozero-{short(n).lower()}", "nozero", f"no-ZeRO path vs plain HF Trainer + PEFT "
                          f"{short(n)}", "train_step", n, m, tuple(args)))
    return steps


def _gen_steps(dry: bool) -> list[Step]:
    from ropescale.common.subsets import SUBSETS

    steps = []
    for shape, prefix, label in (("7b", "gen", "7B MHA"), ("7b-gqa", "gen-gqa", "7B GQA")):
        for name in GEN_SUBSETS:
            sub = SUBSETS[name]
            lo, hi = (_scaled(x, dry) for x in sub.range)
            long_ = sub.target >= 64 * K
            samples, base = (2, 1) if dry else ((4, 1) if long_ else (16, 2))
            args = [str(ROOT / "bench" / "bench_generate.py"), "--min-len", str(lo), "--max-len", str(hi),
                    "--samples", str(samples), "--base-samples", str(base), "--json", "--new-tokens",
                    str(16 if dry else sub.max_new_tokens)]
            args += ["--device", "cpu" if dry else "cuda", "--shape", toy_shape(shape) if dry else shape]
            steps.append(Step(f"{prefix}-{name}", prefix, f"generation {label}, {name} prompts vs plain generate",
                              "generate", sub.target, hi, tuple(args), info={"subset": name, "shape": label}))
    return steps


def _fa2_step(dry: bool) -> Step:
    n = 16 * K
    args = [str(ROOT / "bench" / "gpu_train_step.py"), "--seq", str(_scaled(n, dry)), "--attn", "flash_attention_2",
            "--json"]
    return Step("fa2-16k", "fa2", "FlashAttention-2 vs SDPA, no-ZeRO path 16K", "train_step", n, _scaled(n, dry),
                tuple(args), needs=("cuda", "flash_attn"), info={"versus": "nozero-16k"})


def _smollm2_steps(workdir: Path, dry: bool) -> list[Step]:
    """SmolLM2-135M fine-tuned at full length (bench/gpusuite/smollm2.py): LoRA x2 at 16,384 and x4 at 32,768
    tokens with PI, NTK and YaRN, read on the real-model windows beside the method training-free. Each method is a
    group of its own (x4 is skipped after x2 runs out of memory). The dry run runs yarn x2 for real (512 tokens)
    and the others as the out-of-memory stand-in (``dry_stand_in``)."""
    steps = []
    for scale in SMOLLM2_SCALES:
        for m in SMOLLM2_METHODS:
            n = scale * 8192
            args = (str(ROOT / "bench" / "gpusuite" / "smollm2.py"), "--method", m, "--scale", str(scale),
                    "--workdir", str(workdir / "smollm2")) + (("--dry-run",) if dry else ())
            steps.append(Step(f"smollm2-{m}-x{scale}", f"smollm2-{m}", f"SmolLM2-135M LoRA {m} x{scale} at "
                              f"{short(n)}, read on the real-model windows", "finetune_real", n,
                              n // 32 if dry else n, args, "--timeout",
                              info={"dry_stand_in": dry and not (m == "yarn" and scale == 2)}))
    return steps


def toy_shape(shape: str) -> str:
    """The dry run's stand-in for a generation shape: bench_generate's toy MHA / GQA shape."""
    return "toy" if shape.endswith("gqa") else "toy-mha"


def select(steps: list[Step], names: list[str]) -> list[Step]:
    """The steps named (a step's name, its group's or a set of :data:`SETS`): in plan order, a set in its own
    order; InputError for an unknown name."""
    from ropescale.common.io import InputError

    known = {s.name for s in steps} | {s.group for s in steps} | set(SETS)
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"unknown step {', '.join(bad)} (steps: {', '.join(s.name for s in steps)}; or a group: "
                         f"{', '.join(dict.fromkeys(s.group for s in steps))}; or a set: {', '.join(SETS)})")
    by = {s.name: s for s in steps}
    out: list[Step] = []
    for n in names:
        chosen = [by[x] for x in SETS[n]] if n in SETS else [s for s in steps if s.name == n or s.group == n]
        out += [s for s in chosen if s not in out]
    return out if any(n in SETS for n in names) else [s for s in steps if s in out]


# ---------------------------------------------------------------- expected seconds (a model: docs/gpu.md)
# A training step's process starts in STARTUP_S plus a second per GiB of pinned host memory it allocates (offloaded
# weights and optimizer, the checkpoint pool): the H200's recipe steps took 90.5 s for 4 x 2.8 s at 16K (23.8 GiB
# pinned) and 324.6 s for 4 x 52.3 s at 128K (55.8 GiB), 2026-11-26/27: 79 and 115 s beside 60 + 23.8 and 60 + 55.8.
STARTUP_S = 60.0
PINNED_S_PER_GIB = 1.0
WRITE_S_PER_GB = 2.3  # prepare wrote 15.4 GB of random bf16 weights in 35 s (and built CPU Adam in 43 s)
FIXED_S = {"env": 30.0, "prepare": 80.0}  # measured on the H200: 23.6 s (+ the new checks) and 80.5 s


def expected_seconds(step: Step, gpu_gib: float = 139.8, host_gib: float = 125.0) -> float | None:
    """The step's expected wall time on one GPU of ``gpu_gib`` (the time model of ropescale.training.memory.plan, the
    start-up above); None for steps it does not model (generation, no-ZeRO)."""
    if step.kind in ("env", "prepare"):
        return FIXED_S[step.kind]
    if step.kind == "finetune_real":
        return SMOLLM2_S[step.tokens // 8192]
    if step.kind != "train_path":
        return None
    from dataclasses import replace

    from ropescale.common.forward_memory import GIB
    from ropescale.training.memory import plan as planner
    from ropescale.training.memory.estimate import QWEN15_7B, Setup

    layers = step.info.get("layers")
    shape = replace(QWEN15_7B, layers=layers) if layers else QWEN15_7B
    machine = planner.Machine("suite", int(gpu_gib * GIB), int(host_gib * GIB))
    base = Setup(length=step.tokens)
    if step.info.get("plan") == "recipe":
        c = planner.evaluate(planner.recipe_plan(base, shape, cuda=True), shape, base, machine)
    elif layers:
        ta = step.info.get("tile_attention", 0)
        fixed = planner.Plan(offload_params=False, offload_optimizer=True, recompute_every=1,
                             tile_mlp=0 if ta else 4096, tile_attention=ta, head_chunk_zero3=True)
        c = planner.evaluate(fixed, shape, base, machine)
    else:
        try:
            c = planner.choose(shape, base, machine)
        except planner.NoFit:
            return None
    pinned = (c.estimate.host) / GIB
    write = WRITE_S_PER_GB * shape.total_params() * 2 / 1e9 if layers else 0.0
    return round(write + STARTUP_S + PINNED_S_PER_GIB * pinned + step.info.get("steps", 1) * c.seconds["step"], 1)
