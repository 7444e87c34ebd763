#!/usr/bin/env python
"""Every GPU figure of this project from one resumable command.

    python bench/gpu_suite.py --workdir DIR            # on a GPU machine: run again until it says "complete"
    python bench/gpu_suite.py --dry-run                # the same plan on CPU, toy shapes, tiny lengths (~2 min)
    python bench/gpu_suite.py --workdir DIR --report   # the table so far, nothing run
    python bench/gpu_suite.py --estimate               # each step's expected seconds on one H200, nothing run

A plan of steps, run in order, each one a subprocess (the existing benchmarks with their own flags, or this
script's own ``--_step``), each bounded by ``--step-seconds`` (the step's whole process group is stopped there and
the step recorded as timed out). Every outcome is recorded in ``DIR/suite.json`` (written atomically): ``done``,
``failed`` (with the error's last line; out of memory and time-outs are marked as such) or ``skipped`` (with why).
Running the same command again continues with the next step and never repeats a done or failed one (``--redo``
forgets chosen ones); a step whose run was cut off (the suite killed, its process gone: suite.json still says
``running``) runs again. At the end it prints the whole table (markdown, or ``--json``) and writes it to
``DIR/suite.md``. One suite at a time per DIR (a lock); processes a killed suite left behind are stopped by the
next one. With ``--max-seconds``, a step the time model expects to outlast what is left is not started.

The plan (``gpusuite/plan.py``; random bf16 weights: the Qwen1.5-7B shape written once into DIR/train with the shared
Qwen2 tokenizer beside it; the Qwen2.5-7B GQA shape built on the GPU for generation):

1. ``env``: GPU, memory, torch / transformers / CUDA versions, FlashAttention found or not, the SDPA kernels' times
   on the 7B attention shape, the CUDA allocator setting in force; a smoke check that the memory paths
   (checkpoint offload, blocks, device + host checkpoints, selective recompute, tiled MLP, label-only head) give the
   plain path's loss and gradients on a small shape in bf16.
2. ``prepare``: the random 7B model written to DIR/train/model-7b (and DeepSpeed's CPU Adam op built), so that no
   measured step pays for them. Not a figure: run again where its model is gone (a fresh machine, suite.json
   carried) or where it failed; ``env`` likewise runs again on another device or where its record predates a check.
3. ``recipe-16k`` ... ``recipe-512k``: the recipe path, ``deepspeed finetune.py --recipe
   recipes/qwen1.5-7b_ntk-x8_16k.yaml`` (NTK x16 at 512K) with the plan it ran with before the memory planner
   (``--memory-plan recipe --sdpa-backend default``: ZeRO-3, weights + optimizer offloaded, every layer recomputed,
   checkpoints to the host and the MLP tiled from 64K) through ``bench/bench_train_path.py``.
4. ``plan-16k`` ... ``plan-512k``: the same command with the planner's plan (``--memory-plan fit``) and the
   measured attention kernel. Each train step: steady tokens/s and MFU, peak GPU and host memory, the plan, and
   the memory model's estimate beside the measurement. After the first length of a group that runs out of memory
   (GPU or host) or time, the longer ones are skipped.
5. ``fit-2l``, ``fit-4l``: the 7B shape cut to 2 and 4 layers, one step each at 512K with one fixed plan: the
   measured peaks' per-layer slope and constant against the memory model's.
6. ``nozero-16k``, ``nozero-32k``: the no-ZeRO path (``bench/gpu_train_step.py``, SDPA) against plain HF Trainer
   + PEFT in the same step.
7. ``gen-L`` ... ``gen-3XL`` (7B MHA) and ``gen-gqa-L`` ... ``gen-gqa-3XL`` (GQA): the hf backend of
   ``eval_summ.py generate`` vs plain ``generate`` (``bench/bench_generate.py``) on prompts of each CNNSum
   subset's range and generation budget: samples/hour, peak memory, and the estimated wall time of all of CNNSum
   x 2 prompts.
8. ``fa2-16k``: FlashAttention-2 vs SDPA at 16K on the no-ZeRO path, where flash_attn is importable.

``--only`` takes steps, groups (``recipe``, ``plan``, ``fit``, ...) or the sets ``first`` (env, prepare,
recipe-16k, plan-16k, plan-128k) and ``second`` (plan-32k, plan-64k, plan-256k, fit-2l, fit-4l, plan-512k): what
one command of ~9 minutes runs on a fresh machine, then what the next continues with.

``--dry-run`` runs the same plan and code on CPU: toy shapes, lengths / 256, few steps and samples, the recipe
path without the launcher process (``python finetune.py``, the same ZeRO-3 offload config), the no-ZeRO path's two
variants one after the other in one process (``gpu_train_step.py --in-process``). Each step's processes spend most
of their time importing torch, transformers, PEFT and DeepSpeed (~8-14 s of CPU each on a 2-core machine), so by
default the dry run runs each kind of step once for real (its 16K length, and the 2-layer cut), and the longer
lengths end as the ``--fake-oom-above 16384`` stand-in below: a simulated out-of-memory error (the table says
``simulated``), after which the longer lengths of the group are skipped, exactly as on the GPU. ``--all-lengths``
runs every length for real instead (minutes). Test hook: ``--fake-oom-above TOKENS`` makes every step whose nominal
length is above TOKENS end as a CUDA out-of-memory error would (a stand-in process prints the error; nothing is
run), so that the skip-after-OOM logic is exercised through the same detection as a real one. Bad input (a corrupt
suite.json, a dry run's DIR used for a real run, a missing package): exit code 2 and one line. Exit 0: the plan is
complete (out of memory / time-outs are results); 1: complete, but a step failed with an error; 3: stopped before
the end (``--max-seconds``, a signal): run again.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its package beside it, also where it is loaded by path

from gpusuite.plan import SETS, expected_seconds, plan, select, short
from gpusuite.runner import (
    MIN_START_SECONDS,
    Context,
    Interrupted,
    Suite,
    gpu_name,
    log,
    on_signal,
    preflight,
    run_plan,
    stop_leftovers,
)
from gpusuite.steps import run_env_step, run_prepare_step
from gpusuite.table import cnnsum_counts, markdown, report

TABLE_MD = "suite.md"
LOCK = "suite.lock"
DRY_FAKE_OOM_ABOVE = 16 * 1024  # the dry run's default --fake-oom-above (--all-lengths: none)
EXIT_INCOMPLETE = 3


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
    ap.add_argument("--only", action="append", default=[], help="run only these steps, groups or sets "
                    f"({', '.join(SETS)}; comma-separated, repeatable), e.g. --only first or --only recipe,gen-3XL")
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
    ap.add_argument("--estimate", action="store_true", help="run nothing: each step's expected seconds on one GPU "
                    "of --gpu-gib (the time model of ropescale/training/memory/plan.py and the measured start-up; "
                    "with --only, those steps and their sum)")
    ap.add_argument("--gpu-gib", type=float, default=139.8, help="with --estimate: the GPU's memory (default "
                    "%(default)s, an H200)")
    ap.add_argument("--json", action="store_true", help="the table as one JSON object instead of markdown")
    ap.add_argument("--_step", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.only = [x for v in a.only for x in v.split(",") if x]
    a.redo = [x for v in a.redo for x in v.split(",") if x]
    if a.estimate:
        return a
    if not a.workdir and not a.dry_run:
        ap.error("--workdir is required (except with --dry-run)")
    if a.step_seconds <= 0 or (a.max_seconds is not None and a.max_seconds <= 0):
        ap.error("--step-seconds and --max-seconds must be positive")
    if a.all_lengths and (not a.dry_run or a.fake_oom_above is not None):
        ap.error("--all-lengths goes with --dry-run, and not with --fake-oom-above")
    a.fake_oom_default = a.dry_run and not a.all_lengths and a.fake_oom_above is None
    if a.fake_oom_default:
        a.fake_oom_above = DRY_FAKE_OOM_ABOVE
    return a


def gpu_gib(device: str | None) -> float | None:
    """The memory in GiB of a device named as gpu_name() names it ("NVIDIA H200, 143771 MiB")."""
    try:
        return float(str(device).rsplit(",", 1)[1].split()[0]) / 1024
    except (IndexError, ValueError):
        return None


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


def estimate(a) -> int:
    """--estimate: the plan's (or --only's) steps with their expected seconds."""
    steps = plan(Path("DIR"), False)
    steps = select(steps, a.only) if a.only else steps
    rows = [(s.name, expected_seconds(s, a.gpu_gib)) for s in steps]
    total = sum(v for _, v in rows if v)
    if a.json:
        print(json.dumps({"gpu_gib": a.gpu_gib, "steps": dict(rows), "total_modelled_seconds": round(total, 1)}))
        return 0
    print("| step | expected seconds |\n|---|---|")
    for name, v in rows:
        print(f"| {name} | {'-' if v is None else f'{v:,.0f}'} |")
    print(f"| all modelled | {total:,.0f} |")
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.estimate:
        from ropescale.common.io import InputError

        try:
            return estimate(a)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if a._step:
        from ropescale.common.process import prepare_process

        prepare_process()  # as every entry point, before torch: the CUDA allocator setting, quiet libraries
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
                      a.fake_oom_default, gpu_gib=gpu_gib(device))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
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
