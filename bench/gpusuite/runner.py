"""The GPU suite's runner: the record (``DIR/suite.json``), each step as a bounded subprocess, reading its output,
what is skipped and why, the memory model and MFU beside a measurement, and what must be installed first.

Part of ``bench/gpu_suite.py`` (see its doc).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .plan import ROOT, Step, expected_seconds, model_shape

STATE = "suite.json"
FORMAT = "ropescale-gpu-suite"
MARK = "ROPESCALE_GPU_SUITE"  # in every step's environment: the suite finds what a killed run left behind
FINAL = ("done", "failed")
MIN_START_SECONDS = 30  # with --max-seconds: no step starts with less than this left
KILL_GRACE = 10  # seconds between SIGTERM and SIGKILL
ENV_UNUSABLE = 3  # the env step's exit code when this machine cannot run the suite (it stops the invocation)
FAKE_OOM = ("import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory (a stand-in: "
            "--fake-oom-above {limit} and this step stands for {tokens} tokens; nothing ran)\\n'); sys.exit(1)")


def log(msg: str) -> None:
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


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
            from ropescale.common.runs.record import now

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
        from ropescale.common.runs.record import now

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
    if "host memory:" in low:  # ropescale.training.memory.offload.check_host_memory's refusal
        return "host"
    return None


def parse_train_path(out: str, err: str) -> dict:
    """bench_train_path.py --json: its one result (see that script)."""
    doc = last_json(out) or {}
    r = (doc.get("results") or [{}])[0]
    res = {k: r[k] for k in ("tokens_per_s_steady", "steady_steps", "tokens_per_s_last_step", "steps_done",
                             "step_seconds", "peak_gpu_gib", "peak_gpu_reserved_gib", "host_peak_rss_gib",
                             "host_used_peak_gib", "memory_plan", "memory", "attention", "final_loss", "wall_seconds",
                             "seq", "shape", "rc") if k in r}
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
           "train_step": parse_train_step, "generate": parse_generate, "finetune_real": parse_internal}


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


def on_signal(signum, frame):
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
    gpu_gib: float | None = None  # the GPU's memory (nvidia-smi): expected seconds and plans are for it
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
            if res.get("oom") and r.get("simulated"):
                return f"after {s.name}'s simulated out-of-memory error (a stand-in: nothing ran)"
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
    if step.name == "env":  # a check, not a figure: again on another device, where it found nothing usable, or
        # where its record predates the checks it makes now (the memory paths' variants)
        res = rec.get("result") or {}
        return rec.get("device") != ctx.device or bool(res.get("unusable")) or "variants" not in (res.get("smoke")
                                                                                                   or {})
    return False


def command(step: Step, ctx: Context, bound: float) -> tuple[list[str], str | None]:
    """(the command, a note): the step's own, or the out-of-memory stand-in of --fake-oom-above."""
    stand_in = ctx.fake_oom_default and step.info.get("dry_stand_in")
    if stand_in or ctx.fake_oom_above is not None and step.tokens > ctx.fake_oom_above and not (
            ctx.fake_oom_default and step.info.get("dry_real")):
        code = FAKE_OOM.format(limit=ctx.fake_oom_above, tokens=step.tokens)
        if stand_in:
            return [sys.executable, "-c", code], ("fake OOM (the dry run's stand-in for a step of a kind that runs "
                                                  "once for real; --all-lengths runs it)")
        how = "the dry run's default " if ctx.fake_oom_default else ""
        return [sys.executable, "-c", code], (f"fake OOM ({how}--fake-oom-above {ctx.fake_oom_above}"
                                              + ("; --all-lengths runs every length)" if how else ")"))
    cmd = [sys.executable, *step.args]
    if step.timeout_flag:  # the script stops its own children a little inside the bound
        cmd += [step.timeout_flag, str(max(1, int(bound - min(45, bound / 5))))]
    return cmd, None


def execute(step: Step, suite: Suite, ctx: Context, bound: float, limited: bool) -> dict | None:
    """Run one step and record its outcome; None when the invocation's own budget cut it off (it runs again)."""
    from ropescale.common.runs.record import now

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
        if note and note.startswith("fake OOM"):
            rec["simulated"] = True  # a stand-in that ran nothing: the table says so, not "failed"
    suite.put(step.name, rec)
    said = "simulated out of memory (a stand-in: nothing ran)" if rec.get("simulated") else rec["status"] + (
        f": {rec['error']}" if rec["status"] == "failed" else "")
    log(f"{step.name}: {said} ({rec['seconds']:.0f} s)")
    return rec


def run_plan(suite: Suite, steps: list[Step], full: list[Step], ctx: Context) -> str:
    """Run what is left of ``steps``: 'complete', 'budget' (--max-seconds ran out) or 'unusable' (env)."""
    from ropescale.common.runs.record import now

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
        need = None if ctx.dry else expected_seconds(step, ctx.gpu_gib or 139.8)
        gets = None if left is None else left - min(45, left / 5)  # the step's own time limit inside its bound
        if gets is not None and need is not None and need > gets and step.name != "prepare":
            log(f"{step.name}: expected to take ~{need:.0f} s, it would get {gets:.0f} s (--max-seconds): not started")
            return "budget"
        bound = ctx.step_seconds if left is None else min(ctx.step_seconds, left)
        rec = execute(step, suite, ctx, bound, limited=bound < ctx.step_seconds)
        if rec is None:
            return "budget"
        if step.kind == "env" and (rec.get("result") or {}).get("unusable"):
            return "unusable"
    return "complete"


# ---------------------------------------------------------------- the memory model beside a measurement
def _shape(ctx: Context, shape_name: str | None = None):
    from ropescale.common.forward_memory import Shape
    from ropescale.common.io import read_json
    from ropescale.training.memory.estimate import QWEN15_7B

    cfg = ctx.workdir / "train" / f"model-{shape_name or model_shape(ctx.dry)}" / "config.json"
    if not cfg.is_file():
        return None if ctx.dry else QWEN15_7B
    c = read_json(cfg, "the model's config")
    heads = int(c["num_attention_heads"])
    return Shape(layers=int(c["num_hidden_layers"]), hidden=int(c["hidden_size"]), heads=heads,
                 kv_heads=int(c.get("num_key_value_heads") or heads), intermediate=int(c["intermediate_size"]),
                 vocab=int(c["vocab_size"]), head_dim=c.get("head_dim"), tied=bool(c.get("tie_word_embeddings")))


def add_estimate(step: Step, res: dict, ctx: Context) -> dict:
    """Beside a training measurement: the memory model's per-GPU peak for what the step ran (the run's own
    estimate for the plan it chose, from its run.json; else rebuilt: the no-ZeRO path with fp32 master copies) and
    MFU (the step's model FLOPs, ``planner.model_flops``, over its time and the card's dense bf16 peak)."""
    if step.kind not in ("train_path", "train_step") or step.name.startswith("fa2"):
        return res
    from ropescale.common.forward_memory import GIB
    from ropescale.training.memory.estimate import Setup, auto_memory, estimate
    from ropescale.training.memory.plan import mfu, model_flops, peak_flops

    shape = _shape(ctx, res.get("shape"))
    if shape is None:
        return res
    own = ((res.get("memory") or {}).get("estimate_gib") or {})
    if own.get("peak") is not None:
        res["model_estimate_gib"], res["model_estimate_at"] = round(own["peak"], 2), own.get("at")
    else:
        zero = {} if step.kind == "train_path" else {"zero": 0, "offload_param": False, "offload_optimizer": False}
        s = Setup(length=step.run_tokens, dtype_bytes=4 if ctx.dry else 2, **zero)
        plan_ = res.get("memory_plan") or (res.get("ours") or {}).get("memory_plan")
        if plan_:
            from dataclasses import replace

            s = replace(s, offload_checkpoints=bool(plan_.get("offload_checkpoints")),
                        tile_mlp=int(plan_.get("tile_mlp") or 0))
        elif not ctx.dry:
            s = auto_memory(s, shape)
        e = estimate(shape, s)
        res["model_estimate_gib"] = round(e.peak / GIB, 2)
        res["model_estimate_at"] = e.at
    tps = res.get("tokens_per_s_steady") or res.get("tokens_per_s_last_step") or \
        (res.get("ours") or {}).get("tokens_per_s")
    if tps:
        flops = model_flops(shape, Setup(length=step.run_tokens))
        res["model_flops"] = flops
        m = mfu(flops, step.run_tokens / tps, None if ctx.dry else peak_flops(ctx.device))
        if m is not None:
            res["mfu"] = round(m, 4)
    return res


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
    out = [] if has_module("torch") else ["torch (the machine's own CUDA build: not installed)"]
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


def has_module(module: str) -> bool:
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

