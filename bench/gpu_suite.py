#!/usr/bin/env python
"""Every GPU figure of this project from one resumable command.

    python bench/gpu_suite.py --workdir DIR            # on a GPU machine: run again until it says "complete"
    python bench/gpu_suite.py --dry-run                # the same plan on CPU, toy shapes, tiny lengths (~70 s)
    python bench/gpu_suite.py --workdir DIR --report   # the table so far, nothing run

A plan of steps, run in order, each one a subprocess (the existing benchmarks with their own flags, or this
script's own ``--_step``), each bounded by ``--step-seconds`` (the step's whole process group is stopped there and
the step recorded as timed out). Every outcome is recorded in ``DIR/suite.json`` (written atomically): ``done``,
``failed`` (with the error's last line; out of memory and time-outs are marked as such) or ``skipped`` (with why).
Running the same command again continues with the next step and never repeats a done or failed one (``--redo``
forgets chosen ones); a step whose run was cut off (the suite killed, its process gone: suite.json still says
``running``) runs again. At the end it prints the whole table (markdown, or ``--json``) and writes it to
``DIR/suite.md``. One suite at a time per DIR (a lock); processes a killed suite left behind are stopped by the
next one.

The plan (random bf16 weights: the Qwen1.5-7B shape written once into DIR/train with the shared Qwen2 tokenizer
beside it; the Qwen2.5-7B GQA shape built on the GPU for generation, where it costs nothing to write):

1. ``env``: GPU, memory, torch / transformers / CUDA versions, FlashAttention found or not, the CUDA allocator
   setting in force; a smoke check that the memory paths (checkpoint offload, tiled MLP, label-only head) give the
   plain path's loss and gradients on a small shape in bf16.
2. ``prepare``: the random 7B model written to DIR/train/model-7b (and DeepSpeed's CPU Adam op built), so that no
   measured step pays for them. Not a figure: run again where its model is gone (a fresh machine, suite.json
   carried) or where it failed; ``env`` likewise runs again on another device.
3. ``recipe-16k`` ... ``recipe-512k``: the recipe path, ``deepspeed finetune.py --recipe
   recipes/qwen1.5-7b_ntk-x8_16k.yaml`` (ZeRO-3, parameter + optimizer offload; NTK x16 at 512K) through
   ``bench/bench_train_path.py``: steady tokens/s, peak GPU and host memory, the memory plan, and the memory
   model's estimate (``ropescale/training/memory_model.py``) beside the measurement. After the first length that
   runs out of memory (GPU or host) or time, the longer ones are skipped.
4. ``nozero-16k``, ``nozero-32k``: the no-ZeRO path (``bench/gpu_train_step.py``, SDPA) against plain HF Trainer
   + PEFT in the same step.
5. ``gen-L`` ... ``gen-3XL`` (7B MHA) and ``gen-gqa-L`` ... ``gen-gqa-3XL`` (GQA): the hf backend of
   ``eval_summ.py generate`` vs plain ``generate`` (``bench/bench_generate.py``) on prompts of each CNNSum
   subset's range and generation budget: samples/hour, peak memory, and the estimated wall time of all of CNNSum
   x 2 prompts.
6. ``fa2-16k``: FlashAttention-2 vs SDPA at 16K on the no-ZeRO path, where flash_attn is importable.

``--dry-run`` runs the same plan and code on CPU: toy shapes, lengths / 256, few steps and samples, the recipe
path without the launcher process (``python finetune.py``, the same ZeRO-3 offload config), the no-ZeRO path's two
variants one after the other in one process (``gpu_train_step.py --in-process``). Each step's processes spend most
of their time importing torch, transformers, PEFT and DeepSpeed (~8-14 s of CPU each on a 2-core machine), so by
default the dry run runs each kind of step once for real, at its 16K length, and the longer lengths end as the
``--fake-oom-above 16384`` stand-in below: an out-of-memory error, after which the longer lengths of the group are
skipped, exactly as on the GPU. ``--all-lengths`` runs every length for real instead (minutes). Test hook:
``--fake-oom-above TOKENS`` makes every step whose nominal length is above TOKENS end as a CUDA out-of-memory
error would (a stand-in process prints the error; nothing is run), so that the skip-after-OOM logic is exercised
through the same detection as a real one. Bad input (a corrupt suite.json, a dry run's DIR used for a real run, a
missing package): exit code 2 and one line. Exit 0: the plan is complete (out of memory / time-outs are results);
1: complete, but a step failed with an error; 3: stopped before the end (``--max-seconds``, a signal): run again.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()

STATE = "suite.json"
TABLE_MD = "suite.md"
LOCK = "suite.lock"
FORMAT = "ropescale-gpu-suite"
MARK = "ROPESCALE_GPU_SUITE"  # in every step's environment: the suite finds what a killed run left behind
K = 1024
RECIPE_LENGTHS = (16 * K, 32 * K, 64 * K, 128 * K, 256 * K, 512 * K)
NOZERO_LENGTHS = (16 * K, 32 * K)
GEN_SUBSETS = ("L", "XL", "2XL", "3XL")
DRY_DIV = 256  # the dry run's lengths: the nominal ones / 256
DRY_FAKE_OOM_ABOVE = 16 * K  # the dry run's default --fake-oom-above (--all-lengths: none)
CNNSUM_PROMPTS = 2  # Prompt-IE and Prompt-IB (the paper's Sec 4)
# CNNSum's samples per subset (695 in all, the paper's Sec 3.2). The paper gives only the total; the release files'
# sizes (12.5 / 25.6 / 52.7 / 57.5 MB, github.com/CxsGhost/CNNSum at 994a7f9) over Table 1's mean lengths (15,721 /
# 31,844 / 64,303 / 128,751 Yi tokens), scaled to 695, give this split: an estimate; --cnnsum-dir counts the files.
CNNSUM_COUNTS_ESTIMATED = {"L": 193, "XL": 195, "2XL": 199, "3XL": 108}
FINAL = ("done", "failed")
MIN_START_SECONDS = 30  # with --max-seconds: no step starts with less than this left
KILL_GRACE = 10  # seconds between SIGTERM and SIGKILL
EXIT_INCOMPLETE = 3
ENV_UNUSABLE = 3  # the env step's exit code when this machine cannot run the suite (it stops the invocation)
FAKE_OOM = ("import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory (a stand-in: "
            "--fake-oom-above {limit} and this step stands for {tokens} tokens; nothing ran)\\n'); sys.exit(1)")


def log(msg: str) -> None:
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


def short(n: int) -> str:
    """16384 -> 16K."""
    return f"{n // K}K" if n % K == 0 else str(n)


# ---------------------------------------------------------------- the plan
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
    """The steps in order (see module doc)."""
    return [*_setup_steps(workdir, dry), *_recipe_steps(workdir, dry), *_nozero_steps(dry), *_gen_steps(dry),
            _fa2_step(dry)]


def _scaled(n: int, dry: bool) -> int:
    return n // DRY_DIV if dry else n


def _self(step: str, workdir: Path, dry: bool) -> tuple:
    return (str(THIS), "--_step", step, "--workdir", str(workdir)) + (("--dry-run",) if dry else ())


def _setup_steps(workdir: Path, dry: bool) -> list[Step]:
    return [Step("env", "env", "environment + bf16 smoke check of the memory paths", "env",
                 args=_self("env", workdir, dry)),
            Step("prepare", "prepare", f"random {'toy' if dry else '7B (Qwen1.5 shape)'} bf16 model written to "
                 "DIR/train", "prepare", args=_self("prepare", workdir, dry))]


def model_shape(dry: bool) -> str:
    """bench_train_path's --shape of the written model."""
    return "toy" if dry else "7b"


def _recipe_steps(workdir: Path, dry: bool) -> list[Step]:
    steps = []
    for n in RECIPE_LENGTHS:
        m = _scaled(n, dry)
        train_steps = 4 if n <= 128 * K else 3 if n <= 256 * K else 2  # 2 warm-up steps, then steady ones
        args = [str(ROOT / "bench" / "bench_train_path.py"), "--shape", model_shape(dry), "--lengths", str(m),
                "--workdir", str(workdir / "train"), "--steps", str(2 if dry else train_steps), "--json"]
        if dry:
            args += ["--launcher", "python"]  # the launcher process alone costs seconds of imports per step
        if n > 256 * K:
            args.append("--ft-arg=--scale=16")  # NTK x8 reaches 262,144 tokens; x16 524,288
        steps.append(Step(f"recipe-{short(n).lower()}", "recipe", f"recipe path (deepspeed finetune.py, ZeRO-3 "
                          f"offload) {short(n)}", "train_path", n, m, tuple(args), "--timeout"))
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


def toy_shape(shape: str) -> str:
    """The dry run's stand-in for a generation shape: bench_generate's toy MHA / GQA shape."""
    return "toy" if shape.endswith("gqa") else "toy-mha"


def select(steps: list[Step], names: list[str]) -> list[Step]:
    """The steps named (a step's name or its group's), in plan order; InputError for an unknown name."""
    from ropescale.common.io import InputError

    known = {s.name for s in steps} | {s.group for s in steps}
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"unknown step {', '.join(bad)} (steps: {', '.join(s.name for s in steps)}; or a group: "
                         f"{', '.join(dict.fromkeys(s.group for s in steps))})")
    return [s for s in steps if s.name in names or s.group in names]


# ---------------------------------------------------------------- the record
class Suite:
    """DIR/suite.json: {format, version, dry_run, created, updated, steps: {name: record}} (see module doc)."""

    def __init__(self, workdir: Path, dry: bool):
        from ropescale.common.io import InputError, read_json

        self.dir = workdir
        self.path = workdir / STATE
        if self.path.is_file():
            self.data = read_json(self.path, "the suite's record")
            if self.data.get("format") != FORMAT or not isinstance(self.data.get("steps"), dict):
                raise InputError(f"{self.path}: not a GPU suite record (format {self.data.get('format')!r})")
            if bool(self.data.get("dry_run")) != dry:
                what = "a dry run's" if self.data.get("dry_run") else "a GPU run's"
                raise InputError(f"{self.path} is {what} record: use another --workdir "
                                 f"({'without' if self.data.get('dry_run') else 'with'} --dry-run here)")
        else:
            from ropescale.common.runs import now

            self.data = {"format": FORMAT, "version": 1, "dry_run": dry, "created": now(), "steps": {}}

    @property
    def steps(self) -> dict:
        return self.data["steps"]

    def put(self, name: str, rec: dict | None) -> None:
        if rec is None:
            self.steps.pop(name, None)
        else:
            self.steps[name] = rec
        self.save()

    def save(self) -> None:
        from ropescale.common.io import write_json_atomic
        from ropescale.common.runs import now

        self.data["updated"] = now()
        write_json_atomic(self.path, self.data)


# ---------------------------------------------------------------- reading a step's output
def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def error_line(text: str) -> str:
    """The error's last line: the last line naming an error, else the last line (progress bars dropped)."""
    lines = [x.strip() for x in text.replace("\r", "\n").splitlines() if x.strip()]
    lines = [x for x in lines if not x.startswith(("finetune:", "step ")) and "%|" not in x] or lines
    named = [x for x in lines if "Error" in x or "error:" in x or "rror " in x]
    return (named or lines or [""])[-1][:400]


def memory_kind(text: str) -> str | None:
    """'gpu' for a CUDA out-of-memory error, 'host' for a host-memory refusal, else None."""
    low = text.lower()
    if "out of memory" in low or "outofmemoryerror" in low:
        return "gpu"
    if "host memory:" in low:  # ropescale.training.memory.check_host_memory's refusal
        return "host"
    return None


def parse_train_path(out: str, err: str) -> dict:
    """bench_train_path.py --json: its one result (see that script)."""
    doc = last_json(out) or {}
    r = (doc.get("results") or [{}])[0]
    res = {k: r[k] for k in ("tokens_per_s_steady", "steady_steps", "tokens_per_s_last_step", "steps_done",
                             "peak_gpu_gib", "peak_gpu_reserved_gib", "host_peak_rss_gib", "host_used_peak_gib",
                             "memory_plan", "final_loss", "wall_seconds", "seq", "rc") if k in r}
    if not r:
        return {"error": error_line(err)}
    if r.get("rc", 0) != 0:
        res["error"] = r.get("error") or error_line(err)
        res["timed_out"] = r.get("rc") == 124
        kind = "gpu" if r.get("oom") else memory_kind(res["error"])
        if r.get("rc") in (-9, 137) and not kind:
            kind, res["error"] = "host", f"killed by SIGKILL (the host's OOM killer?) | {res['error']}"
        if kind:
            res["oom"] = kind
    return res


def parse_train_step(out: str, err: str) -> dict:
    """gpu_train_step.py --json: ours (and the plain HF Trainer + PEFT baseline)."""
    doc = last_json(out) or {}
    res = {}
    for r in doc.get("results") or []:
        keep = {k: r[k] for k in ("tokens_per_s", "peak_mem_gib", "seconds_per_step", "attn", "dtype", "device",
                                  "memory_plan", "final_loss", "oom", "error") if k in r}
        res[r.get("variant", "ours")] = keep
    ours = res.get("ours")
    if ours is None:
        return {"error": error_line(err)}
    if ours.get("oom") or ours.get("error"):
        res["error"] = ours.get("error") or error_line(err)
        if ours.get("oom") or memory_kind(res["error"]):
            res["oom"] = "gpu" if ours.get("oom") else memory_kind(res["error"])
    return res


def parse_generate(out: str, err: str) -> dict:
    """bench_generate.py --json: the baseline, ours (the slot decoder), the ratio."""
    doc = last_json(out)
    if not doc:
        return {"error": error_line(err)}
    ours = doc.get("ours") or {}
    best = ours.get("slots") or next(iter(ours.values()), {})
    return {"prompt_tokens": doc.get("prompt_tokens"), "new_tokens": doc.get("new_tokens"), "gpu": doc.get("gpu"),
            "dtype": doc.get("dtype"), "ratio": doc.get("ratio"),
            "baseline": {k: doc.get("baseline", {}).get(k) for k in ("samples", "samples_per_hour", "peak_gib")},
            "ours": {k: best.get(k) for k in ("samples_per_hour", "peak_gib", "cuda_graph", "seconds")}}


def parse_internal(out: str, err: str) -> dict:
    doc = last_json(out)
    return doc if doc is not None else {"error": error_line(err)}


PARSERS = {"env": parse_internal, "prepare": parse_internal, "train_path": parse_train_path,
           "train_step": parse_train_step, "generate": parse_generate}


# ---------------------------------------------------------------- processes
def step_env(workdir: Path, dry: bool) -> dict:
    env = dict(os.environ)
    env[MARK] = str(workdir)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if dry:  # CPU even on a GPU machine; one thread per process is fastest for toy shapes on shared cores
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, dead but not yet waited for, are not)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for d in proc.glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # after the name: state, ppid, pgrp
            return True
    return False


def stop_group(pgid: int) -> None:
    """SIGTERM the process group, SIGKILL what is left after KILL_GRACE seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.time() + (KILL_GRACE if sig == signal.SIGTERM else 2)
        while time.time() < end:
            if not group_alive(pgid):
                return
            time.sleep(0.1)


def leftovers(workdir: Path) -> list[int]:
    """Processes whose environment carries this suite's mark for ``workdir`` (a killed suite's steps)."""
    want = f"{MARK}={workdir}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid == os.getpid():
            continue
        try:
            if want in (d / "environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return found


def stop_leftovers(workdir: Path) -> int:
    pids = leftovers(workdir)
    for pid in pids:
        try:
            stop_group(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for pid in leftovers(workdir):  # one not in a group of its own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if pids:
        log(f"stopped {len(pids)} process(es) an earlier run left behind")
    return len(pids)


class Interrupted(Exception):
    """The suite got SIGTERM / SIGINT: the step in flight is stopped and runs again next time."""


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


@dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    seconds: float
    killed: bool  # stopped at its bound
    cpu_seconds: float = 0.0  # host CPU time of the step's processes that were waited for


def spawn(cmd: list[str], env: dict, bound: float, logs: Path, name: str, on_start) -> Outcome:
    """Run ``cmd`` in its own process group with stdout / stderr to DIR/logs/NAME.{out,err}; past ``bound``
    seconds the group is stopped."""
    import resource

    logs.mkdir(parents=True, exist_ok=True)
    out_f, err_f = logs / f"{name}.out", logs / f"{name}.err"
    t0 = time.time()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = ru.ru_utime + ru.ru_stime
    with open(out_f, "w", encoding="utf-8") as fo, open(err_f, "w", encoding="utf-8") as fe:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            on_start(p.pid)
            try:
                rc, killed = p.wait(timeout=bound), False
            except subprocess.TimeoutExpired:
                stop_group(p.pid)
                rc, killed = p.wait(), True
        except BaseException:
            stop_group(p.pid)
            p.wait()
            raise
    read = lambda f: f.read_text(encoding="utf-8", errors="replace")  # noqa: E731
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Outcome(rc, read(out_f), read(err_f), time.time() - t0, killed, ru.ru_utime + ru.ru_stime - cpu0)


# ---------------------------------------------------------------- running the plan
@dataclass
class Context:
    workdir: Path
    dry: bool
    device: str
    step_seconds: float
    max_seconds: float | None = None
    fake_oom_above: int | None = None
    fake_oom_default: bool = False  # the dry run's default, not asked for
    started: float = field(default_factory=time.time)

    def remaining(self) -> float | None:
        return None if self.max_seconds is None else self.max_seconds - (time.time() - self.started)


def skip_reason(step: Step, suite: Suite, plan_: list[Step], ctx: Context) -> str | None:
    """Why ``step`` is skipped now (re-decided at every run), or None."""
    import importlib.util

    if "cuda" in step.needs and ctx.dry:
        return "needs a CUDA GPU (dry run on CPU)"
    if "flash_attn" in step.needs and importlib.util.find_spec("flash_attn") is None:
        return ("flash_attn is not importable here (pip install flash-attn --no-build-isolation, or carry a wheel "
                "built for this torch)")
    for s in plan_:
        if s is step:
            break
        r = suite.steps.get(s.name) or {}
        if s.group == step.group and r.get("status") == "failed" and r.get("device") == ctx.device:
            res = r.get("result") or {}
            if res.get("oom"):
                return f"{s.name} ran out of {res['oom'].upper() if res['oom'] == 'gpu' else 'host'} memory"
            if res.get("timed_out"):
                return f"{s.name} ran out of time ({r.get('bound', ctx.step_seconds):g} s)"
    return None


def prepared(workdir: Path, dry: bool) -> bool:
    return (workdir / "train" / f"model-{model_shape(dry)}" / "bench_model.json").is_file()


def needs_run(step: Step, rec: dict | None, ctx: Context) -> bool:
    if not rec or rec.get("status") not in FINAL:
        return True  # new, skipped (re-decided), or cut off while running
    if step.name == "prepare":
        return rec["status"] == "failed" or not prepared(ctx.workdir, ctx.dry)
    if step.name == "env":  # a check, not a figure: again on another device, or where it found nothing usable
        return rec.get("device") != ctx.device or bool((rec.get("result") or {}).get("unusable"))
    return False


def command(step: Step, ctx: Context, bound: float) -> tuple[list[str], str | None]:
    """(the command, a note): the step's own, or the out-of-memory stand-in of --fake-oom-above."""
    if ctx.fake_oom_above is not None and step.tokens > ctx.fake_oom_above:
        code = FAKE_OOM.format(limit=ctx.fake_oom_above, tokens=step.tokens)
        how = "the dry run's default " if ctx.fake_oom_default else ""
        return [sys.executable, "-c", code], (f"fake OOM ({how}--fake-oom-above {ctx.fake_oom_above}"
                                              + ("; --all-lengths runs every length)" if how else ")"))
    cmd = [sys.executable, *step.args]
    if step.timeout_flag:  # the script stops its own children a little inside the bound
        cmd += [step.timeout_flag, str(max(1, int(bound - min(45, bound / 5))))]
    return cmd, None


def execute(step: Step, suite: Suite, ctx: Context, bound: float, limited: bool) -> dict | None:
    """Run one step and record its outcome; None when the invocation's own budget cut it off (it runs again)."""
    from ropescale.common.runs import now

    prev = suite.steps.get(step.name) or {}
    cmd, note = command(step, ctx, bound)
    rec = {"status": "running", "started": now(), "device": ctx.device, "pid": os.getpid(), "bound": bound,
           "runs": int(prev.get("runs", 0)) + 1, "cmd": [Path(c).name if c == sys.executable else c for c in cmd]}
    if note:
        rec["note"] = note

    def started(pid):
        rec["child"] = pid
        suite.put(step.name, rec)

    log(f"{step.name}: {step.title} (bound {bound:.0f} s)")
    o = spawn(cmd, step_env(ctx.workdir, ctx.dry), bound, ctx.workdir / "logs", step.name, started)
    stop_leftovers(ctx.workdir)
    res = PARSERS[step.kind](o.out, o.err)
    timed_out = o.killed or bool(res.get("timed_out"))
    if timed_out and limited:
        log(f"{step.name}: --max-seconds ran out; it runs again next time")
        suite.put(step.name, prev or None)
        return None
    if o.killed:
        res["timed_out"] = True
        res["error"] = f"timed out after {bound:.0f} s (--step-seconds) | {error_line(o.err)}".rstrip(" |")
    elif o.rc != 0 and "error" not in res:
        res["error"] = error_line(o.err) or f"exit code {o.rc}"
    if not o.killed and "error" in res and "oom" not in res:
        if o.rc in (-9, 137):  # SIGKILL that the suite did not send
            res["oom"], res["error"] = "host", f"killed by SIGKILL (the host's OOM killer?) | {res['error']}"
        elif memory_kind(res["error"] + "\n" + o.err[-20000:]):
            res["oom"] = memory_kind(res["error"] + "\n" + o.err[-20000:])
    if step.kind == "env" and o.rc == ENV_UNUSABLE:
        res["unusable"] = True
    rec.pop("child", None)
    rec.update(status="failed" if (o.rc != 0 or o.killed or "error" in res) else "done", ended=now(),
               seconds=round(o.seconds, 1), cpu_seconds=round(o.cpu_seconds, 1), result=add_estimate(step, res, ctx))
    if rec["status"] == "failed":
        rec["error"] = res.get("error", "")
    suite.put(step.name, rec)
    log(f"{step.name}: {rec['status']}" + (f": {rec['error']}" if rec["status"] == "failed" else "") +
        f" ({rec['seconds']:.0f} s)")
    return rec


def run_plan(suite: Suite, steps: list[Step], full: list[Step], ctx: Context) -> str:
    """Run what is left of ``steps``: 'complete', 'budget' (--max-seconds ran out) or 'unusable' (env)."""
    from ropescale.common.runs import now

    for step in steps:
        rec = suite.steps.get(step.name)
        if not needs_run(step, rec, ctx):
            continue
        why = skip_reason(step, suite, full, ctx)
        if why:
            if rec is None or rec.get("status") != "skipped" or rec.get("why") != why:
                suite.put(step.name, {"status": "skipped", "why": why, "device": ctx.device, "ended": now()})
                log(f"{step.name}: skipped: {why}")
            continue
        left = ctx.remaining()
        if left is not None and left < min(MIN_START_SECONDS, ctx.step_seconds):
            return "budget"
        bound = ctx.step_seconds if left is None else min(ctx.step_seconds, left)
        rec = execute(step, suite, ctx, bound, limited=bound < ctx.step_seconds)
        if rec is None:
            return "budget"
        if step.kind == "env" and (rec.get("result") or {}).get("unusable"):
            return "unusable"
    return "complete"


# ---------------------------------------------------------------- the memory model beside a measurement
def _shape(ctx: Context):
    from ropescale.common.io import read_json
    from ropescale.training.memory_model import QWEN15_7B, Shape

    cfg = ctx.workdir / "train" / f"model-{model_shape(ctx.dry)}" / "config.json"
    if not cfg.is_file():
        return None if ctx.dry else QWEN15_7B
    c = read_json(cfg, "the model's config")
    heads = int(c["num_attention_heads"])
    return Shape(layers=int(c["num_hidden_layers"]), hidden=int(c["hidden_size"]), heads=heads,
                 kv_heads=int(c.get("num_key_value_heads") or heads), intermediate=int(c["intermediate_size"]),
                 vocab=int(c["vocab_size"]), head_dim=c.get("head_dim"), tied=bool(c.get("tie_word_embeddings")))


def add_estimate(step: Step, res: dict, ctx: Context) -> dict:
    """The memory model's per-GPU peak for what the step ran (the recipe path: ZeRO-3 with offload; the no-ZeRO
    path: fp32 master copies), with the memory plan the run logged (checkpoint offload, MLP tiling) where it did."""
    if step.kind not in ("train_path", "train_step") or step.name.startswith("fa2"):
        return res
    from ropescale.training.memory_model import GIB, Setup, auto_memory, estimate

    shape = _shape(ctx)
    if shape is None:
        return res
    zero = {} if step.kind == "train_path" else {"zero": 0, "offload_param": False, "offload_optimizer": False}
    s = Setup(length=step.run_tokens, dtype_bytes=4 if ctx.dry else 2, **zero)
    plan_ = res.get("memory_plan") or (res.get("ours") or {}).get("memory_plan")
    if plan_:
        from dataclasses import replace

        s = replace(s, offload_checkpoints=bool(plan_.get("offload_checkpoints")), tile_mlp=int(plan_.get("tile_mlp")
                                                                                                 or 0))
    elif not ctx.dry:
        s = auto_memory(s, shape)
    e = estimate(shape, s)
    res["model_estimate_gib"] = round(e.peak / GIB, 2)
    res["model_estimate_at"] = e.at
    return res


# ---------------------------------------------------------------- the table
def _gib(v) -> str:
    return "-" if v is None else f"{v:g} GiB"


def _rate(v, unit: str = "tok/s") -> str:
    return "-" if v is None else f"{v:,.0f} {unit}"


def describe(step: Step, rec: dict) -> tuple[str, str, str, str]:
    """(result, peak GPU memory, host memory, the memory model) cells of a done or failed step."""
    r = rec.get("result") or {}
    fn = {"env": _describe_env, "prepare": _describe_prepare, "train_path": _describe_train_path,
          "train_step": _describe_train_step, "generate": _describe_generate}[step.kind]
    return fn(r)


def _describe_env(r: dict) -> tuple[str, str, str, str]:
    v = r.get("versions") or {}
    fa = r.get("flash_attn") or "not found"
    sm = r.get("smoke") or {}
    smoke = (f"smoke {'ok' if sm.get('ok') else 'MISMATCH'}: loss {sm.get('plain_loss')} plain vs "
             f"{sm.get('paths_loss')} memory paths, gradient cosine {sm.get('grad_cosine')}") if sm else ""
    text = (f"{r.get('device', '-')}; torch {v.get('torch', '-')} (CUDA {r.get('cuda') or '-'}), transformers "
            f"{v.get('transformers', '-')}, peft {v.get('peft', '-')}, deepspeed {v.get('deepspeed', '-')}; "
            f"flash-attn {fa}; allocator {r.get('alloc_conf') or 'default'}; {smoke}")
    return text, _gib(r.get("gpu_gib")), _gib(r.get("host_gib")), "-"


def _describe_prepare(r: dict) -> tuple[str, str, str, str]:
    p = r.get("params")
    text = f"{p / 1e9:.2f}B parameters at {r.get('path', '-')}" if p else str(r.get("path", "-"))
    if r.get("cpu_adam"):
        text += f"; DeepSpeed CPU Adam op: {r['cpu_adam']}"
    return text, "-", "-", "-"


def _model_cell(r: dict, measured) -> str:
    est = r.get("model_estimate_gib")
    if est is None:
        return "-"
    if measured:
        return f"{est:g} GiB ({100 * (est / measured - 1):+.1f}%)"
    return f"{est:g} GiB"


def _describe_train_path(r: dict) -> tuple[str, str, str, str]:
    tps = r.get("tokens_per_s_steady")
    if tps:
        text = f"{_rate(tps)} ({r.get('steady_steps', 0)} steady steps)"
    elif r.get("tokens_per_s_last_step"):
        text = f"{_rate(r['tokens_per_s_last_step'])} (last step; no steady steps)"
    else:
        text = "-"
    plan_ = r.get("memory_plan")
    if plan_:
        text += f"; offload {'on' if plan_.get('offload_checkpoints') else 'off'}, tile {plan_.get('tile_mlp', 0)}"
    if r.get("steps_done") is not None:
        text += f"; {r['steps_done']} steps"
    gpu = _gib(r.get("peak_gpu_gib"))
    if r.get("peak_gpu_reserved_gib"):
        gpu += f" ({r['peak_gpu_reserved_gib']:g} reserved)"
    host = f"RSS {_gib(r.get('host_peak_rss_gib'))}, machine {_gib(r.get('host_used_peak_gib'))}"
    return text, gpu, host, _model_cell(r, r.get("peak_gpu_gib"))


def _describe_train_step(r: dict) -> tuple[str, str, str, str]:
    ours, base = r.get("ours") or {}, r.get("baseline")
    text = f"ours {_rate(ours.get('tokens_per_s'))} ({ours.get('attn', '-')})"
    gpu = f"ours {_gib(ours.get('peak_mem_gib'))}"
    if base is not None:
        b = "OOM" if base.get("oom") else _rate(base.get("tokens_per_s"))
        text += f" vs plain HF Trainer + PEFT {b}"
        if base.get("tokens_per_s") and ours.get("tokens_per_s"):
            text += f" ({ours['tokens_per_s'] / base['tokens_per_s']:.2f}x)"
        gpu += f", plain {_gib(base.get('peak_mem_gib'))}"
    return text, gpu, "-", _model_cell(r, ours.get("peak_mem_gib"))


def _describe_generate(r: dict) -> tuple[str, str, str, str]:
    b, o = r.get("baseline") or {}, r.get("ours") or {}
    lo, hi = (r.get("prompt_tokens") or ["?", "?"])[:2]
    text = (f"ours {_rate(o.get('samples_per_hour'), 'samples/h')} vs plain generate "
            f"{_rate(b.get('samples_per_hour'), 'samples/h')} ({r.get('ratio', '-')}x); prompts {lo}-{hi} tokens, "
            f"{r.get('new_tokens', '-')} new")
    return text, f"ours {_gib(o.get('peak_gib'))}, plain {_gib(b.get('peak_gib'))}", "-", "-"


HEADER = ["step", "what", "status", "result", "peak GPU", "host", "memory model", "device", "note"]


def rows(steps: list[Step], suite: Suite) -> list[list[str]]:
    out = []
    for s in steps:
        rec = suite.steps.get(s.name)
        status = (rec or {}).get("status", "pending")
        cells = ("-", "-", "-", "-")
        note = (rec or {}).get("note", "")
        if status == "done" or (status == "failed" and s.kind == "train_path" and (rec.get("result") or {})
                                .get("steps_done")):
            cells = describe(s, rec)
        if status == "failed":
            note = "; ".join(x for x in (note, ("OUT OF MEMORY: " if (rec.get("result") or {}).get("oom") else "")
                                         + rec.get("error", "")) if x)
        elif status == "skipped":
            note = rec.get("why", "")
        elif status == "running":
            note = "cut off (runs again next time)"
        title = s.title + (f" (dry run: {s.run_tokens} tokens)" if suite.data.get("dry_run") and s.run_tokens
                           else "")
        row = [s.name, title, status, *cells, (rec or {}).get("device", "-"), note]
        out.append([str(c).replace("|", "/") for c in row])
    return out


def cnnsum_counts(cnnsum_dir: str | None) -> tuple[dict, str]:
    """(samples per subset, where they come from): the release files of ``cnnsum_dir`` counted, else the
    estimate :data:`CNNSUM_COUNTS_ESTIMATED`."""
    from ropescale.common.io import InputError
    from ropescale.common.subsets import SUBSETS

    if not cnnsum_dir:
        return dict(CNNSUM_COUNTS_ESTIMATED), "estimated split of the 695 samples (see bench/gpu_suite.py)"
    counts = {}
    for name in GEN_SUBSETS:
        f = Path(cnnsum_dir) / f"{SUBSETS[name].release_file}.jsonl"
        if not f.is_file():
            raise InputError(f"{f}: no such file (--cnnsum-dir holds the release's cnnsum_*.jsonl files)")
        with open(f, encoding="utf-8") as fh:
            counts[name] = sum(1 for line in fh if line.strip())
    return counts, f"counted in {cnnsum_dir}"


def cnnsum_hours(steps: list[Step], suite: Suite, counts: dict) -> list[dict]:
    """Per generation shape and side: hours per subset for its samples x 2 prompts, and the total where every
    subset ran."""
    out = []
    for prefix in dict.fromkeys(s.group for s in steps if s.kind == "generate"):
        gen = [s for s in steps if s.group == prefix]
        for side in ("ours", "baseline"):
            per = {}
            for s in gen:
                rec = suite.steps.get(s.name) or {}
                res = rec.get("result") or {}
                sph = (res.get(side) or {}).get("samples_per_hour") if rec.get("status") == "done" else None
                sub = s.info["subset"]
                per[sub] = float(f"{counts[sub] * CNNSUM_PROMPTS / sph:.3g}") if sph else (
                    "OOM" if res.get("oom") else None)
            total = float(f"{sum(per.values()):.3g}") if all(isinstance(v, float) for v in per.values()) else None
            out.append({"shape": gen[0].info["shape"], "side": "eval_summ hf backend" if side == "ours" else
                        "plain generate", "hours": per, "total_hours": total})
    return out


def fa2_line(suite: Suite) -> str | None:
    fa, sd = (suite.steps.get(n) or {} for n in ("fa2-16k", "nozero-16k"))
    a = ((fa.get("result") or {}).get("ours") or {}).get("tokens_per_s")
    b = ((sd.get("result") or {}).get("ours") or {}).get("tokens_per_s")
    if fa.get("status") == "done" and sd.get("status") == "done" and a and b:
        return f"FlashAttention-2 vs SDPA at 16K (no-ZeRO path): {a:,.0f} vs {b:,.0f} tok/s ({a / b:.2f}x)"
    return None


def report(steps: list[Step], suite: Suite, counts: tuple[dict, str]) -> dict:
    st = [(suite.steps.get(s.name) or {}).get("status", "pending") for s in steps]
    return {"format": FORMAT, "workdir": str(suite.dir), "dry_run": bool(suite.data.get("dry_run")),
            "complete": all(x in FINAL or x == "skipped" for x in st),
            "counts": {k: st.count(k) for k in ("done", "failed", "skipped", "running", "pending")},
            "header": HEADER, "rows": rows(steps, suite), "cnnsum": {"samples": counts[0], "source": counts[1],
                                                                     "prompts": CNNSUM_PROMPTS,
                                                                     "estimates": cnnsum_hours(steps, suite,
                                                                                               counts[0])},
            "fa2_vs_sdpa": fa2_line(suite), "steps": {s.name: suite.steps.get(s.name) for s in steps}}


def markdown(rep: dict) -> str:
    from ropescale.common.tables import markdown as md_table

    c = rep["counts"]
    head = (f"GPU suite{' (DRY RUN: CPU, toy shapes: no figure here is a GPU figure)' if rep['dry_run'] else ''}: "
            f"{rep['workdir']} — {c['done']} done, {c['failed']} failed, {c['skipped']} skipped, "
            f"{c['pending'] + c['running']} to run" + (" — complete" if rep["complete"] else ""))
    parts = [head, "", md_table(rep["header"], rep["rows"])]
    est = rep["cnnsum"]["estimates"]
    if any(e["total_hours"] or any(isinstance(v, float) for v in e["hours"].values()) for e in est):
        s = rep["cnnsum"]["samples"]
        hdr = ["shape", "generator", *(f"{k} ({s[k]} x {rep['cnnsum']['prompts']})" for k in GEN_SUBSETS),
               "all of CNNSum"]
        cell = lambda v: "-" if v is None else v if isinstance(v, str) else f"{v:g} h"  # noqa: E731
        parts += ["", f"Estimated wall time of all of CNNSum x {rep['cnnsum']['prompts']} prompts (samples: "
                  f"{rep['cnnsum']['source']}):", "",
                  md_table(hdr, [[e["shape"], e["side"], *(cell(e["hours"].get(k)) for k in GEN_SUBSETS),
                                  cell(e["total_hours"])] for e in est])]
    if rep.get("fa2_vs_sdpa"):
        parts += ["", rep["fa2_vs_sdpa"]]
    return "\n".join(parts)


# ---------------------------------------------------------------- before anything runs
def missing_packages() -> list[str]:
    """What the steps import but this Python lacks or has outside the tested ranges (pyproject.toml's
    dependencies, requirements-deepspeed.txt): ["name (wanted: installed)"]."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    reqs = []
    try:
        import tomllib

        reqs = list(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])
    except ModuleNotFoundError:  # Python 3.10: the names alone
        reqs = ["transformers", "peft", "accelerate", "datasets", "safetensors", "tokenizers", "numpy", "pyyaml"]
    for line in (ROOT / "requirements-deepspeed.txt").read_text(encoding="utf-8").splitlines():
        if line.split("#")[0].strip():
            reqs.append(line.split("#")[0].strip())
    out = [] if _has("torch") else ["torch (the machine's own CUDA build: not installed)"]
    for text in reqs:
        r = Requirement(text)
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            out.append(f"{r.name} ({r.specifier or 'any'}: not installed)")
            continue
        if r.specifier and not r.specifier.contains(have, prereleases=True):
            out.append(f"{r.name} ({r.specifier}: {have} installed)")
    return out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


INSTALL_HINT = ("install: ROPESCALE_SYSTEM_TORCH=1 make setup (keeps the machine's torch) and run with "
                ".venv/bin/python; on an offline GPU machine: ../shared/tools/gpu-wheels.sh here, carry .whl/, there "
                "python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export "
                "PYTHONPATH=/tmp/site:$PWD (docs/gpu.md)")


def preflight(dry: bool) -> str | None:
    """One line naming what is missing and how to install it, or None."""
    from ropescale.common.paths import QWEN2_TOKENIZER

    miss = missing_packages()
    if miss:
        return f"missing or outside the tested range: {', '.join(miss)}; {INSTALL_HINT}"
    if not (Path(QWEN2_TOKENIZER) / "vocab.json").is_file():
        return (f"the Qwen2 tokenizer is not at {QWEN2_TOKENIZER}: bring ../shared/data/tokenizers/qwen2 along and "
                f"point ROPESCALE_SHARED at the folder holding data/tokenizers/qwen2")
    if not dry and gpu_name() is None:
        return "no NVIDIA GPU here (nvidia-smi finds none): run on a GPU machine, or --dry-run for the CPU rehearsal"
    return None


def gpu_name() -> str | None:
    """The first GPU's name and memory (nvidia-smi: no CUDA context in this process), or None."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = p.stdout.strip().splitlines()[0].strip() if p.returncode == 0 and p.stdout.strip() else ""
    return ", ".join(x.strip() for x in line.split(",")) or None


# ---------------------------------------------------------------- the steps run by this script itself
def run_env_step(dry: bool) -> int:
    """``env``: the environment and the bf16 smoke check; prints one JSON line (see module doc)."""
    from ropescale.common.cli import ALLOC_CONF_VARS, prepare_process

    prepare_process()
    import importlib.metadata as md

    import torch

    cuda = torch.cuda.is_available()
    res = {"cuda": torch.version.cuda, "cuda_available": cuda, "python": sys.version.split()[0],
           "versions": {}, "alloc_conf": next((f"{k}={os.environ[k]}" for k in ALLOC_CONF_VARS if k in os.environ),
                                              None), "cpus": os.cpu_count()}
    for name in ("torch", "transformers", "peft", "accelerate", "deepspeed", "datasets", "flash-attn"):
        try:
            res["versions"][name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    res["flash_attn"] = _flash_attn()
    from ropescale.training.memory import available_host_bytes

    res["host_available_gib"] = round(available_host_bytes() / 2**30, 1)
    res["host_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if cuda:
        p = torch.cuda.get_device_properties(0)
        res.update(device=p.name, gpu_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
    else:
        res["device"] = "cpu"
    if not cuda and not dry:
        res["error"] = (f"torch {torch.__version__} sees no CUDA GPU (a CPU build?): use the machine's own CUDA torch "
                        f"(ROPESCALE_SYSTEM_TORCH=1 make setup)")
        print(json.dumps(res), flush=True)
        print(f"error: {res['error']}", file=sys.stderr)
        return ENV_UNUSABLE
    res["smoke"] = smoke(torch.device("cuda" if cuda else "cpu"))
    print(json.dumps(res), flush=True)
    if not res["smoke"]["ok"]:
        print(f"error: smoke check: the memory paths' loss {res['smoke']['paths_loss']} / gradient cosine "
              f"{res['smoke']['grad_cosine']} differ from the plain path's loss {res['smoke']['plain_loss']}",
              file=sys.stderr)
        return 1
    return 0


def _flash_attn() -> str | None:
    if not _has("flash_attn"):
        return None
    try:
        import flash_attn

        return getattr(flash_attn, "__version__", "found")
    except Exception as e:  # found but broken (built for another torch): say so
        return f"found but fails to import ({type(e).__name__})"


SMOKE_TOL = {"loss": 5e-3, "cosine": 0.99}  # bf16: the paths' kernels round differently, nothing more


def smoke(device) -> dict:
    """The memory paths (checkpoints offloaded to host memory, the MLP tiled over sequence chunks, the label-only
    LM head in chunks: ``ropescale.training.memory.setup_memory`` + ``loss.label_only_loss``, what finetune.py runs)
    against the plain path (gradient checkpointing, the model's own full-logits loss) on a small Qwen2 shape in
    bf16: the loss and the gradients' cosine."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from ropescale.training.loss import label_only_loss
    from ropescale.training.memory import setup_memory

    cuda = device.type == "cuda"
    tokens = 1024 if cuda else 64
    cfg = Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=4096, max_position_embeddings=4096, tie_word_embeddings=False,
                      use_cache=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=g).to(device)
    labels = ids.clone()
    labels[:, : tokens // 2] = -100  # the second half labelled, as a summary after its context

    def grads():
        v = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
        return v

    plain = model(input_ids=ids, labels=labels).loss
    plain.backward()
    g_plain = grads()
    args = argparse.Namespace(offload_checkpoints="true", tile_mlp=tokens // 8, gradient_checkpointing=True,
                              micro_batch=1)
    plan_ = setup_memory(model, args, tokens=tokens, cuda=cuda, dtype=torch.bfloat16, quiet=True)
    paths = label_only_loss(model, ids, labels, chunk=tokens // 8)
    paths.backward()
    g_paths = grads()
    cos = float(torch.nn.functional.cosine_similarity(g_plain, g_paths, dim=0))
    a, b = plain.item(), paths.item()
    return {"tokens": tokens, "dtype": "bfloat16", "plain_loss": round(a, 5), "paths_loss": round(b, 5),
            "abs_diff": round(abs(a - b), 6), "grad_cosine": round(cos, 6), "memory_plan": plan_.record(),
            "ok": abs(a - b) <= SMOKE_TOL["loss"] and cos >= SMOKE_TOL["cosine"], "tolerance": SMOKE_TOL}


def run_prepare_step(workdir: Path, dry: bool) -> int:
    """``prepare``: the random model in DIR/train (bench_train_path's writer) and, on CUDA, DeepSpeed's CPU Adam
    op (JIT-built on first use: minutes on a fresh machine); prints one JSON line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_path", ROOT / "bench" / "bench_train_path.py")
    btp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(btp)
    t0 = time.time()
    out = btp.write_model(model_shape(dry), workdir / "train" / f"model-{model_shape(dry)}")
    res = {"path": str(out), "params": json.loads((out / "bench_model.json").read_text())["params"],
           "seconds": round(time.time() - t0, 1)}
    import torch

    if torch.cuda.is_available() and not dry:
        t1 = time.time()
        from deepspeed.ops.op_builder import CPUAdamBuilder

        CPUAdamBuilder().load()
        res["cpu_adam"] = f"built in {time.time() - t1:.0f} s"
    print(json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------- main
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="model, data, logs and suite.json (kept; the same DIR continues the run); "
                                      "default with --dry-run: a temporary directory, removed at the end")
    ap.add_argument("--dry-run", action="store_true", help="the same plan on CPU: toy shapes, lengths / 256; the "
                    f"steps above {short(DRY_FAKE_OOM_ABOVE)} end as the out-of-memory stand-in unless --all-lengths")
    ap.add_argument("--step-seconds", type=float, default=540, help="the bound of each step (default %(default)s)")
    ap.add_argument("--max-seconds", type=float, help="this invocation's budget: no step starts with less than "
                    f"{MIN_START_SECONDS} s left, and a step it cuts off runs again next time (exit code 3)")
    ap.add_argument("--only", action="append", default=[], help="run only these steps or groups (comma-separated, "
                                                                "repeatable), e.g. --only recipe,gen-3XL")
    ap.add_argument("--redo", action="append", default=[], help="forget these steps' records first, so they run "
                                                                "again (comma-separated, repeatable)")
    ap.add_argument("--report", action="store_true", help="run nothing: print the table recorded in --workdir")
    ap.add_argument("--cnnsum-dir", help="the CNNSum release files (cnnsum_L_16k.jsonl, ...): their sample counts "
                                         "for the wall-time estimate (default: an estimated split of the 695)")
    ap.add_argument("--fake-oom-above", type=int, metavar="TOKENS",
                    help="test hook: steps standing for more than TOKENS tokens end as a CUDA out-of-memory error "
                         "would, without running (nominal lengths: 16384 for 16K, also in a dry run; a dry run's "
                         f"default: {DRY_FAKE_OOM_ABOVE})")
    ap.add_argument("--all-lengths", action="store_true",
                    help=f"with --dry-run: every length runs for real (minutes), instead of the lengths above "
                         f"{short(DRY_FAKE_OOM_ABOVE)} ending as the --fake-oom-above {DRY_FAKE_OOM_ABOVE} stand-in")
    ap.add_argument("--json", action="store_true", help="the table as one JSON object instead of markdown")
    ap.add_argument("--_step", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not a.workdir and not a.dry_run:
        ap.error("--workdir is required (except with --dry-run)")
    if a.step_seconds <= 0 or (a.max_seconds is not None and a.max_seconds <= 0):
        ap.error("--step-seconds and --max-seconds must be positive")
    if a.all_lengths and (not a.dry_run or a.fake_oom_above is not None):
        ap.error("--all-lengths goes with --dry-run, and not with --fake-oom-above")
    a.fake_oom_default = a.dry_run and not a.all_lengths and a.fake_oom_above is None
    if a.fake_oom_default:
        a.fake_oom_above = DRY_FAKE_OOM_ABOVE
    a.only = [x for v in a.only for x in v.split(",") if x]
    a.redo = [x for v in a.redo for x in v.split(",") if x]
    return a


def lock(workdir: Path):
    """An exclusive lock on DIR/suite.lock for this process's life; None when another suite holds it."""
    import fcntl

    f = open(workdir / LOCK, "a+")  # held open until the process ends
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def main(argv=None) -> int:
    a = parse_args(argv)
    if a._step:
        workdir = Path(a.workdir).resolve()
        return run_env_step(a.dry_run) if a._step == "env" else run_prepare_step(workdir, a.dry_run)
    from ropescale.common.io import InputError

    tmp = None
    if not a.workdir:
        import tempfile

        tmp = tempfile.mkdtemp(prefix="gpu-suite-dry-")
    workdir = Path(a.workdir or tmp).resolve()
    try:
        return _main(a, workdir)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def _main(a, workdir: Path) -> int:
    from ropescale.common.io import InputError

    workdir.mkdir(parents=True, exist_ok=True)
    suite = Suite(workdir, a.dry_run)
    full = plan(workdir, a.dry_run)
    steps = select(full, a.only) if a.only else full
    counts = cnnsum_counts(a.cnnsum_dir)
    if not a.report:
        held = lock(workdir)
        if held is None:
            raise InputError(f"{workdir}: another gpu_suite is running on this directory ({workdir / LOCK})")
        why = preflight(a.dry_run)
        if why:
            raise InputError(why)
        for name in select(full, a.redo) if a.redo else []:
            suite.steps.pop(name.name, None)
        suite.save()
        stop_leftovers(workdir)
        device = "cpu (dry run)" if a.dry_run else gpu_name()
        ctx = Context(workdir, a.dry_run, device, a.step_seconds, a.max_seconds, a.fake_oom_above,
                      a.fake_oom_default)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _on_signal)
        try:
            how = run_plan(suite, steps, full, ctx)
        except Interrupted as e:
            log(f"interrupted ({e}): the step in flight runs again next time")
            how = "interrupted"
            stop_leftovers(workdir)
            running = [n for n, r in suite.steps.items() if r.get("status") == "running" and r.get("pid") ==
                       os.getpid()]
            for n in running:
                suite.put(n, None)
    rep = report(full, suite, counts)
    from ropescale.common.io import write_text_atomic

    text = markdown(rep)
    if not a.report:
        write_text_atomic(workdir / TABLE_MD, text + "\n")
    print(json.dumps(rep) if a.json else text, flush=True)
    if a.report:
        return 0
    if how != "complete":
        log({"budget": "--max-seconds ran out", "interrupted": "interrupted",
             "unusable": "the environment cannot run the suite (see the env row)"}[how]
            + ": run the same command again to continue")
        return 2 if how == "unusable" else EXIT_INCOMPLETE
    done = rep["complete"] or bool(a.only)
    errors = [n for n, r in rep["steps"].items() if r and r.get("status") == "failed"
              and not (r.get("result") or {}).get("oom") and not (r.get("result") or {}).get("timed_out")]
    log(("complete" if rep["complete"] else "the chosen steps are through") + (f"; failed with an error: "
                                                                                f"{', '.join(errors)}" if errors
                                                                                else ""))
    return 1 if errors else 0 if done else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
