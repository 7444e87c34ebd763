"""One fine-tuning run, top to bottom: settings -> model + RoPE -> data checks -> LoRA -> Trainer -> exports.

Every input problem (model path, numeric settings, data length vs the RoPE-extended context, recipe key, resume
with other settings, --init-from a run of another RoPE setting, batch arithmetic, an --out that cannot be
a directory) raises InputError before the first training step, and before run.json is touched.

The run directory is the run's (``ropescale.common.runs``): --out defaults to ``runs/train/<model>-<rope>-x<scale>``
under the current directory; a directory holding any run record is refused unless it is a finetune run and
``--resume`` continues it or ``--overwrite`` starts it over (nothing is deleted without --overwrite), and one
holding another kind of run (an eval run) is refused whatever the flags.

Resume (``--resume auto|CHECKPOINT``; ``auto`` starts a new run where --out holds none, ``never``, the default, refuses
an --out that holds one unless ``--overwrite``) continues exactly the run in --out: every resolved setting (after the
recipe), the model (its path and its id: ``runs.model_id``), the RoPE setting and the data (path and content: its length
stats) must be those recorded in run.json; only ``--max-steps`` may grow (the one resume check, ``runs.check_resume``,
on :func:`resume_settings`). run.json's ``seconds`` is the whole run's wall time: each part adds its own to what the run
had recorded at its last checkpoint (a killed part counts up to its last checkpoint save).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rope_scaling import RopeSpec
from rope_scaling.load import ModelConfig
from ropescale.common import process
from ropescale.common.cli import dtype_name, rerun_command, when_interrupted
from ropescale.common.io import InputError, read_json
from ropescale.common.runs.identity import length_of, model_id, model_ref
from ropescale.common.runs.locks import run_dir_scope
from ropescale.common.runs.record import RunDir, RunMeta, RunRecord, read_train_record, settings_record
from ropescale.common.runs.resume import check_resume, open_run_dir, refuse_resume
from ropescale.common.settings import check, fmt, from_record

from . import sequence_parallel
from .config import TrainSettings, default_global_batch, resolve_ds_config
from .data import policy_of
from .memory.plan import ds_config_dict  # the DeepSpeed config as this machine and the plan need it
from .positions import Policy

RUNS_DIR = Path("runs") / "train"  # under the current directory, never inside the checkout from elsewhere
RESUME_HINT = ("--resume continues a run only with its settings (only --max-steps may grow): use another --out, or "
               "--overwrite to start over")


def log(msg: str) -> None:
    if process.is_main():
        print(msg, file=sys.stderr, flush=True)


def model_name(model_arg: str) -> str:
    from ropescale.common.models import is_tiny

    return "tiny" if is_tiny(model_arg) else Path(str(model_arg).rstrip("/")).name


def default_output_dir(model_arg: str, spec) -> Path:
    """runs/train/<model>-<rope>-x<scale> ("-none" without scaling), under the current directory."""
    name = model_name(model_arg)
    if not spec.scaled:
        return RUNS_DIR / f"{name}-{spec.method}"
    return RUNS_DIR / f"{name}-{spec.method}-x{spec.scale:g}"


def resume_settings(old: RunMeta, new: TrainSettings) -> TrainSettings:
    """The resolved settings ``new`` of a resume as the run's record compares them: a resume without ``--data``
    uses the run's data; an unset global batch is the default for the recorded train length."""
    was = from_record(TrainSettings, old.settings, where=old.meta_path, without=("rope",))
    batch = new.global_batch
    longest = old.train_length.max if old.train_length else None
    if batch is None and longest:
        batch = default_global_batch(longest)
    return dataclasses.replace(new, data=new.data or was.data, global_batch=batch)


def check_init_rope(init_export: Path, rope: RopeSpec) -> None:
    """--init-from continues training of another run (the 16K -> 32K recipes): it must have the same RoPE."""
    from .saving import EXPORT_JSON

    f = init_export / EXPORT_JSON
    info = read_json(f, "--init-from: export record")
    old = RopeSpec.from_record(info.get("rope"), f)
    if not old.same_rope(rope):
        raise InputError(f"--init-from: that run was trained with RoPE {old.label()}, this run asks for "
                         f"{rope.label()}; pass the same RoPE flags as that run", f)


def latest_checkpoint(run_dir: Path) -> Path | None:
    cps = [(int(m.group(1)), p) for p in run_dir.glob("checkpoint-*")
           if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").is_file()]
    return max(cps)[1] if cps else None


@dataclass
class Run:
    """One run as its phases build it up: :func:`plan_run` fills the first block (nothing written yet),
    :func:`prepare_data` the data and batch, :func:`build_model` the model; the later phases only read it."""

    settings: TrainSettings  # as resolved on this machine (model, out, attention, DeepSpeed file, dtype)
    recipe: str | None
    model: ModelConfig  # the model's config with the RoPE setting applied, read once (rope_scaling.load)
    policy: Policy  # the packing policy (positions, attention, PoSE) of the settings, built once (data.policy_of)
    model_id: str | None  # runs.model_id of the model directory
    run_dir: Path
    rd: RunDir
    old: RunMeta | None  # the run being resumed
    resume: str | None
    resume_from: Path | None
    resume_step: int  # the global step of resume_from (0: none), read once from its trainer_state.json
    overwrite: bool
    init_export: Path | None
    cuda: bool
    world: int
    main: bool
    dtype: Any
    t_start: float
    ds_path: Path | None
    # prepare_data
    data_dir: Path | None = None
    rows: Any = None
    stats: dict = field(default_factory=dict)
    global_batch: int = 0
    grad_accum: int = 0
    # plan_memory
    memory: Any = None  # ropescale.training.memory.plan.Choice: the memory plan and the numbers behind it
    attention: dict = field(default_factory=dict)  # the attention kernel chosen and the check behind it
    # build_model
    extra_names: list = field(default_factory=list)
    trainable: int = 0
    total: int = 0
    # start_record (main process)
    record: RunRecord | None = None

    @property
    def model_dir(self) -> Path:
        return self.model.path

    @property
    def config(self):
        return self.model.config

    @property
    def rope(self) -> RopeSpec:
        """What the model trains with (the flags, or what its config already carries)."""
        return self.model.rope

    @property
    def extended(self) -> int:
        """The context the setting serves; the frequencies' extended context where an attention method (DCA)
        serves any length (``ModelConfig.context`` None)."""
        return self.model.context if self.model.context is not None else self.model.rope_context


@run_dir_scope()
def train(args: TrainSettings, *, recipe: str | None = None, resume: str | None = None,
          overwrite: bool = False) -> dict | None:
    """Run (or resume: ``resume`` "auto" or a checkpoint directory) a fine-tuning run with the settings ``args``;
    returns a summary ({run, steps, seconds, final}) on the main process, None on the others. The phases, in
    order: settings -> data -> memory plan -> trainer arguments -> model -> run record -> trainer -> fit and export."""
    from .curves import check_report_to

    check(args)  # before any work
    policy = policy_of(args)  # a bad combination of --positions / --attention / --pose-* too
    check_report_to(args.report_to)  # an integration that is not installed too
    process.setup_env()
    run = plan_run(args, policy, recipe=recipe, resume=resume, overwrite=overwrite)
    when_interrupted("to continue from the last checkpoint (every --save-steps), run the same command with --resume "
                     f"auto: {rerun_command(['--resume', 'auto'], drop=['--overwrite'])}")
    process.check_master_port(log)  # a port another job holds: one line, not a traceback from the rendezvous
    process.disable_shm_comm()  # (imports deepspeed: after the checks that need none)
    if run.world > 1:  # join the process group first (DeepSpeed sizes its batch from it)
        _init_dist(run.cuda)
    prepare_data(run)
    plan_memory(run)
    targs, ds_cfg = training_arguments(run)
    process.logs_to_stderr()  # DeepSpeed (imported by now when used) logs to stdout: results only there, also per rank
    model = build_model(run, ds_cfg)
    if run.main:
        start_record(run)
    trainer = build_trainer(run, targs, model)
    return fit(run, trainer)


def plan_run(args: TrainSettings, policy: Policy | None = None, *, recipe: str | None, resume: str | None,
             overwrite: bool) -> Run:
    """Phase 1, settings: the model's config with the RoPE rule applied, the run directory and what a resume or
    --init-from may continue. Every check that needs no data; nothing is written. ``policy``: the run's positions
    policy when the caller has built it (``train`` does, once), else built here from ``args``."""
    policy = policy if policy is not None else policy_of(args)
    from ropescale.common.models import resolve_model

    t_start = time.time()
    model_dir = resolve_model(args.model)  # before torch is imported: a missing model is one line at once
    import torch

    from rope_scaling.load import load_config

    from .model import resolve_attn, resolve_dtype
    from .saving import find_export

    cuda = torch.cuda.is_available()
    model = load_config(model_dir, args.rope)
    config, effective = model.config, model.rope
    run_dir = Path(args.out) if args.out else default_output_dir(args.model, effective)
    run_dir, old = open_run_dir(run_dir, "finetune")  # unwritable, a file, another run's, another writer's: refused
    served = "unbounded" if model.context is None else model.context
    log(f"[finetune] model {model_dir} ({config.model_type}), {model.change.message()}: context {served} tokens")
    rd = RunDir(run_dir)
    ds_path = resolve_ds_config(args.deepspeed)
    dtype = resolve_dtype(args.dtype, cuda)
    mid = model_id(model_dir)
    resolved = dataclasses.replace(args, model=model_ref(args.model, model_dir), out=str(run_dir),
                                   attn=resolve_attn(args.attn, cuda), deepspeed=str(ds_path) if ds_path else None,
                                   dtype=dtype_name(str(dtype).replace("torch.", "")))  # fp32: --dtype's words
    sequence_parallel.check_settings(args.sequence_parallel, config=config, world=process.world_size(),
                                     deepspeed=ds_path, attn=resolved.attn, policy=policy)
    from .attn_pick import for_run

    frame = model.context if model.context is not None else model.rope_context  # the lengths to plan kernels for
    attn, attn_rec = for_run(args, resolved.attn, config, cuda=cuda, context=frame, world=process.world_size(),
                             resumed=old.settings.get("attn") if resume and old is not None else None)
    resolved = dataclasses.replace(resolved, attn=attn)
    resume_from = None
    if resume == "never":  # (the default) an --out holding a run is refused below unless --overwrite
        resume = None
    elif resume == "auto" and old is None and latest_checkpoint(run_dir) is None and not (run_dir / "final").exists():
        log(f"[finetune] --resume auto: {run_dir} holds no run yet: starting one")
        resume = None
    if resume:
        if old is None:
            raise InputError("--resume: not a finetune run directory (no run.json)", run_dir)
        check_resume(old, resume_settings(old, resolved), rope=effective, model_id=mid, hint=RESUME_HINT)
        resume_from = latest_checkpoint(run_dir) if resume == "auto" else Path(resume)
        if resume_from is not None and not (resume_from / "trainer_state.json").is_file():
            raise InputError("--resume: not a checkpoint directory", resume_from)
    elif old is not None or latest_checkpoint(run_dir) is not None or (run_dir / "final").exists():
        if not overwrite:  # a run killed before its first checkpoint is a run too (its run.json says so)
            status = f" ({old.status})" if old is not None and old.status else ""
            raise InputError(f"already holds a finetune run{status}: pass --resume auto to continue it with the same "
                             f"settings, --overwrite to start over (its files are deleted), or another --out", run_dir)
        old = None
    init_export = None
    if args.init_from:
        init_export = find_export(args.init_from, args.init_step)
        check_init_rope(init_export, effective)
    return Run(settings=resolved, recipe=recipe, model=model, policy=policy, model_id=mid, run_dir=run_dir, rd=rd,
               old=old, resume=resume, resume_from=resume_from, resume_step=_checkpoint_step(resume_from),
               overwrite=overwrite, init_export=init_export, cuda=cuda, world=process.world_size(),
               main=process.is_main(), dtype=dtype, t_start=t_start, ds_path=ds_path, attention=attn_rec)


def prepare_data(run: Run) -> None:
    """Phase 2, data: the packed set (--data, the resumed run's, or the default one built for the tiny model),
    checked against the model (vocabulary, the extended context) and, on resume, against the recorded stats; the
    batch arithmetic (Appendix B.2)."""
    from data_concat.packed import TRAIN_FILE

    from .data import build_default_data, check_positions, check_rows, load_rows, one_pair_note

    args, old = run.settings, run.old
    rope_desc = f"RoPE {run.rope.label()}" if run.rope.scaled else "no RoPE scaling"
    if args.data:
        data_dir = Path(args.data)
    elif old is not None and old.data and (Path(old.data) / TRAIN_FILE).is_file():
        data_dir = Path(old.data)  # a resume continues on the run's own data
    else:
        orig = run.rope.orig_ctx or run.extended
        if not run.rope.scaled:
            log(f"[finetune] no RoPE scaling (--rope none): training inside the model's own {run.extended}-token "
                f"context; --rope yarn --scale 8 (or pi, ntk, ...) extends it")
        sized = from_record(TrainSettings, old.settings, without=("rope",)) if old is not None else args
        data_dir = build_default_data(run.model_dir, orig, run.extended, factor=args.default_data_factor,
                                      n_samples=max(8, sized.max_steps * (sized.global_batch or 1)),  # as begun
                                      seed=args.seed) if run.main else None
        if run.world > 1:  # other ranks wait for rank 0 to build it
            data_dir = _broadcast_path(data_dir)
    policy = run.policy
    rows = load_rows(data_dir, boundaries=policy.needs_boundaries)
    stats = check_rows(rows, vocab_size=run.config.vocab_size, extended=run.model.context,
                       allow_extrapolation=args.allow_extrapolation, where=data_dir, rope_desc=rope_desc)
    check_positions(rows, policy, extended=run.model.context, allow_extrapolation=args.allow_extrapolation,
                    where=data_dir)
    note = one_pair_note(rows, policy, data_dir)
    if note:
        log(f"[finetune] {note}")
    if old is not None:  # the same path must still hold the same data
        was = old.get("data_stats") or {}
        diffs = [f"data {k} {fmt(was[k])} -> {fmt(stats[k])}" for k in ("samples", "tokens", "supervised", "min",
                                                                          "max") if k in was and was[k] != stats[k]]
        if diffs:
            raise refuse_resume(diffs, run.rd.meta_path, hint=RESUME_HINT)
    log(f"[finetune] data {data_dir}: {stats['samples']} samples, {stats['min']}-{stats['max']} tokens "
        f"(mean {stats['mean']:.0f}), {stats['supervised']} labelled tokens; positions {policy.label()}")
    global_batch = args.global_batch or default_global_batch(stats["max"])
    groups = run.world // args.sequence_parallel  # data-parallel ranks (a sequence group draws one batch)
    per_step = args.micro_batch * groups
    if global_batch % per_step:
        raise InputError(f"global batch {global_batch} is not a multiple of micro batch {args.micro_batch} x "
                         f"{groups} {'sequence groups' if args.sequence_parallel > 1 else 'processes'}")
    run.data_dir, run.rows, run.stats = data_dir, rows, stats
    run.global_batch, run.grad_accum = global_batch, global_batch // per_step
    run.settings = dataclasses.replace(args, data=str(data_dir), global_batch=global_batch)


def plan_memory(run: Run) -> None:
    """Phase 2b, the memory plan (``--memory-plan``, :mod:`ropescale.training.memory.plan`): where the weights, the
    optimizer state and the checkpoints live and what is recomputed, from the memory model, the device's free
    memory and the host's; a plan that cannot fit is refused here, before the model loads."""
    import torch

    from ropescale.common.io import read_json

    from .memory.plan import plan_for_run

    ds = read_json(run.ds_path, "DeepSpeed config") if run.ds_path else None
    prev = (run.old.info.get("memory") if run.old is not None and run.resume else None) or None
    share = run.stats["supervised"] / max(run.stats["tokens"], 1)
    run.memory = plan_for_run(run.config, run.settings, cuda=run.cuda, world=run.world, ds_config=ds,
                              length=run.stats["max"], label_share=share, accum=run.grad_accum, previous=prev,
                              dtype_bytes=torch.empty((), dtype=run.dtype).element_size())
    c = run.memory
    log(f"[finetune] memory plan {c.plan.describe()}; estimated peak {c.estimate.peak / 2**30:.1f} GiB per GPU "
        f"({c.machine.name}; {c.fitting} of {c.considered} plans fit), host {c.host_need / 2**30:.1f} GiB"
        + step_time_note(c.seconds.get("step"), run.cuda))


def step_time_note(seconds: float | None, cuda: bool) -> str:
    """The plan line's time estimate: the time model's seconds a step on a GPU; none on a CPU (the model times GPU
    kernels: on a CPU it said "~0.0 s a step" for steps that take minutes)."""
    if not cuda or seconds is None:
        return "; no time estimate on a CPU (the time model is a GPU's)" if not cuda else ""
    return f", ~{seconds:.1f} s a step (the time model)"


def training_arguments(run: Run):
    """Phase 3, the HF TrainingArguments and the DeepSpeed config this machine runs (before the model: ZeRO-3
    partitions while loading)."""
    import torch
    from transformers import TrainingArguments

    from .curves import report_to

    args, cuda = run.settings, run.cuda
    plan = run.memory.plan if run.memory is not None else None
    offload = (plan.offload_params, plan.offload_optimizer) if plan is not None and plan.name == "fit" else None
    ds_cfg = ds_config_dict(run.ds_path, cuda=cuda, cpu_adam=args.ds_cpu_adam, offload=offload) if run.ds_path \
        else None
    targs = TrainingArguments(
        output_dir=str(run.run_dir), max_steps=args.max_steps, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=run.grad_accum, learning_rate=args.lr, warmup_steps=args.warmup_steps,
        lr_scheduler_type=args.lr_scheduler, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
        adam_epsilon=args.adam_eps,
        logging_steps=args.logging_steps, save_strategy="steps", save_steps=args.save_steps,
        save_total_limit=args.save_total_limit, seed=args.seed, data_seed=args.seed,
        full_determinism=args.deterministic,
        bf16=run.dtype == torch.bfloat16 and cuda, fp16=run.dtype == torch.float16 and cuda, use_cpu=not cuda,
        deepspeed=ds_cfg, report_to=report_to(args.report_to, run.run_dir), remove_unused_columns=False,
        dataloader_num_workers=args.num_workers,
        gradient_checkpointing=False, disable_tqdm=True, log_level="warning",
        optim="adamw_torch_fused" if cuda else "adamw_torch", save_only_model=False,
        ddp_find_unused_parameters=False,  # every trained tensor (LoRA, embeddings, norms) gets a gradient each step
    )
    return targs, ds_cfg


def build_model(run: Run, ds_cfg: dict | None):
    """Phase 4, the model: loaded with the RoPE setting, LoRA + trainable embeddings/norms, --init-from, the memory
    plan (how activations are kept: never what is trained, so a resume may change it), the label-only head."""
    import torch
    from transformers import set_seed

    from .loss import install_label_only_forward
    from .memory.install import setup_memory
    from .model import add_lora, fp32_master, load_model, param_counts
    from .saving import load_export_into

    args = run.settings
    set_seed(args.seed)  # LoRA A is initialised randomly when the adapter is added (before the Trainer seeds)
    model = load_model(run.model, run.dtype, args.attn)
    layout = sequence_layout(run)
    if layout is not None:  # before PEFT wraps the model (DeepSpeed #7729)
        varlen = run.policy.varlen_kernel(args.sequence_parallel)
        sequence_parallel.setup_model(model, layout, args.micro_batch, varlen=varlen)
    peft_model, extra_names = add_lora(model, r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout,
                                       targets=args.lora_targets, embeddings=args.train_embeddings,
                                       norms=args.train_norms, gradient_checkpointing=args.gradient_checkpointing)
    if run.init_export is not None:
        load_export_into(peft_model, run.init_export)
        log(f"[finetune] initialised adapter + trained tensors from {run.init_export}")
    if ds_cfg is None and run.cuda and run.dtype != torch.float32:
        fp32_master(peft_model, run.dtype)  # fp32 trained tensors; the forward runs under autocast
    local_len = -(-run.stats["max"] // args.sequence_parallel)  # the tokens of a sample one process holds
    setup_memory(peft_model, args, max_len=local_len, cuda=run.cuda, dtype=run.dtype, ds_config=ds_cfg,
                 plan=run.memory.plan, quiet=not run.main)
    log(f"[finetune] memory estimate for {run.stats['max']:,}-token samples (a model, not a measurement: "
        f"ropescale/training/memory/estimate.py): {run.memory.estimate.describe()}")
    run.trainable, run.total = param_counts(peft_model)
    run.extra_names = extra_names
    log(f"[finetune] trainable params: {run.trainable:,} of {run.total:,} "
        f"({100 * run.trainable / max(run.total, 1):.3f}%): LoRA r={args.lora_r} on {','.join(args.lora_targets)} + "
        f"{len(extra_names)} embedding/norm tensors; attention {args.attn}, {args.dtype}, "
        f"{'DeepSpeed ' + run.ds_path.stem if run.ds_path else 'no DeepSpeed'}, {run.world} process(es), "
        f"global batch {run.global_batch} = {args.micro_batch} x {run.world // args.sequence_parallel} x "
        f"{run.grad_accum} accumulation" + (f"; {sequence_parallel.describe(layout)}" if layout else ""))
    install_label_only_forward(peft_model, args.head_chunk, zero3_chunks=run.memory.plan.head_chunk_zero3)
    return peft_model


def start_record(run: Run) -> None:
    """Phase 5 (main process), the run record: every check has passed, so now the run directory may change:
    run.json (the record: model and its id, the RoPE spec, the training record, the data, the resolved settings),
    the log cut back to a resumed checkpoint."""
    run_dir, rd, old = run.run_dir, run.rd, run.old
    if run.resume:
        log(f"[finetune] resuming from {run.resume_from or 'the start (no checkpoint yet)'}")
        _cut_log(run_dir / "train_log.jsonl", run.resume_step)
    elif run.overwrite:
        _clear_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    args = run.settings
    train = {"id": (old.train or {}).get("id") if old is not None else None, "run": str(run_dir.resolve()),
             "rope": run.rope.to_dict(), "data": str(Path(args.data).resolve()), "length": length_of(run.stats),
             "samples": run.stats.get("samples"), "supervised_tokens": run.stats.get("supervised"),
             "max_steps": args.max_steps, "global_batch": run.global_batch, "lr": args.lr, "steps": None,
             "base_model": args.model, "base_model_id": run.model_id, "base_train": read_train_record(run.model_dir)}
    train["id"] = train["id"] or uuid.uuid4().hex[:16]  # this run's id: what a merged model names
    run.record = RunRecord(
        "finetune", model=args.model, model_id=run.model_id, rope=run.rope.to_dict(), context=run.model.context,
        train=train, data=args.data, settings=settings_record(args),
        info={"data_stats": run.stats, "recipe": run.recipe, "grad_accum": run.grad_accum, "world_size": run.world,
              "trainable_params": run.trainable, "total_params": run.total, "extra_trained": run.extra_names,
              "memory": run.memory.record() if run.memory is not None else None,
              "attention": run.attention or None},
        seconds=old.seconds if old is not None else 0.0,  # the parts before this one
        created=old.get("created") if old is not None else None)
    rd.write_record(run.record)
    run.config.save_pretrained(str(run_dir))  # the rope setting next to the run, readable at once


def export_kwargs(run: Run) -> dict:
    """What every export of this run (checkpoints' and the final one) records beside the tensors."""
    return dict(extra_names=run.extra_names, base_model=str(run.model_dir), config=run.config,
                rope=run.rope.to_dict(), tokenizer_dir=run.model_dir,
                train=run.record.train if run.record is not None else None)


def record_callback(run: Run):
    """A Trainer callback that writes run.json's steps and seconds so far at each checkpoint (main process), so a
    killed run's time up to its last checkpoint is counted when it is resumed."""
    from transformers import TrainerCallback

    class RecordCallback(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            _close_record(run, state.global_step, "running")

    return RecordCallback()


def _close_record(run: Run, step: int, status: str, **info) -> RunRecord:
    """run.json with the steps done and the whole run's seconds (the earlier parts + this one)."""
    rec = run.record
    part = time.time() - run.t_start
    rec.seconds = round((run.old.seconds if run.old is not None else 0.0) + part, 1)
    rec.status = status
    rec.train["steps"] = step
    rec.info.update(steps=step, **info)
    run.rd.write_record(rec)
    return rec


def build_trainer(run: Run, targs, model):
    """Phase 6, the trainer: the label-only Trainer on the packed rows, our progress log and exports in place of
    HF's printers; on a resume without DeepSpeed, the trained embeddings/norms of the checkpoint's export."""
    from ropescale.common.compat import stdout_callbacks

    from .data import Collator, PackedDataset
    from .saving import load_export_into
    from .trainer import CoverageCallback, ExportCallback, LabelOnlyTrainer, ProgressCallback, start_coverage

    config = run.config
    pad_id = config.pad_token_id if config.pad_token_id is not None else \
        (config.eos_token_id if isinstance(config.eos_token_id, int) else 0)
    collator = Collator(pad_id=pad_id)
    layout = sequence_layout(run)
    if layout is not None:  # each rank gets its slice of the group's batch
        collator = sequence_parallel.ShardCollator(collator, layout, pad_id, run.settings.micro_batch)
    dataset = PackedDataset(run.rows, run.policy, seed=run.settings.seed)
    coverage = start_coverage(run.extended, run.resume_from if run.main else None,  # counts add over the ranks
                              run.resume_step, log if run.main else None)
    trainer = LabelOnlyTrainer(model=model, args=targs, train_dataset=dataset, data_collator=collator,
                               sequence_layout=layout, coverage=coverage)
    ref = weakref.ref(trainer)
    for cb in stdout_callbacks():  # they print log dicts to stdout; ours go to stderr
        trainer.remove_callback(cb)
    trainer.add_callback(ProgressCallback(ref, run.run_dir / "train_log.jsonl" if run.main else None, run.main,
                                          run.world))
    trainer.add_callback(CoverageCallback(ref, run.record.train if run.record is not None else None, run.main))
    trainer.add_callback(ExportCallback(ref, export_kwargs(run), run.main))  # after the coverage: it exports it
    if run.main:
        trainer.add_callback(record_callback(run))
    if run.resume_from is not None and not run.settings.deepspeed:
        # HF restores only the PEFT adapter of a PEFT model; the trained embeddings/norms come from our export
        # (under DeepSpeed its checkpoint holds every trainable tensor and restores them itself)
        load_export_into(model, run.resume_from / "export")
    return trainer


def fit(run: Run, trainer) -> dict | None:
    """Phase 7, train and export: the final export in ``final/`` and the run record closed (main process)."""
    from .saving import export

    resume_from = run.resume_from
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    cov = trainer.total_coverage()
    if run.record is not None:
        run.record.train["coverage"] = cov.to_json()
        log(f"[finetune] positions trained: up to {cov.longest} (longest distance {cov.longest_distance}) of the "
            f"{cov.context}-token context" + (f", counted from step {cov.from_step}" if cov.from_step else ""))
    out = export(trainer.model, run.run_dir / "final", step=trainer.state.global_step, is_main=run.main,
                 **export_kwargs(run))
    if not run.main:
        return None
    rec = _close_record(run, trainer.state.global_step, "done", final=str(out))
    return {"run": str(run.run_dir), "steps": trainer.state.global_step, "seconds": rec.seconds, "final": str(out)}


def sequence_layout(run: Run):
    """Where this process sits under ``--sequence-parallel K`` (``sequence_parallel.Layout``); None for K = 1."""
    k = run.settings.sequence_parallel
    return sequence_parallel.Layout(k, run.world, process.rank()) if k > 1 else None


def _clear_run(run_dir: Path) -> None:
    """--overwrite: remove what a previous run wrote (only the files finetune writes)."""
    import shutil

    for p in list(run_dir.glob("checkpoint-*")) + [run_dir / "final"]:
        shutil.rmtree(p, ignore_errors=True)
    for name in ("train_log.jsonl", "run.json", "config.json"):
        (run_dir / name).unlink(missing_ok=True)


def _checkpoint_step(ckpt: Path | None) -> int:
    if ckpt is None:
        return 0
    return int(json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def _cut_log(path: Path, step: int) -> None:
    """Drop log records after the checkpoint a resumed run restarts from (they are logged again)."""
    if not path.is_file():
        return
    from ropescale.common.io import write_text_atomic

    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a torn last line of a killed run
    write_text_atomic(path, "".join(x + "\n" for x in keep))


def _init_dist(cuda: bool) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    try:
        import deepspeed
    except ImportError:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        return
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")


def _broadcast_path(p):
    import torch.distributed as dist

    obj = [str(p) if p is not None else None]
    dist.broadcast_object_list(obj, src=0)
    return Path(obj[0])
