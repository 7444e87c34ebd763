"""The HF Trainer with the label-only loss and a warm-up that starts above 0, progress lines (loss, the learning
rate each step ran with, per-step and steady tokens/s, peak memory), the loss-and-learning-rate PNG at the end
(``curves``) and exports at saves."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from ropescale.common import compat
from ropescale.common.io import share_private_files

from .positions import Coverage
from .saving import export
from .sequence_parallel import SHARD_KEYS


def peak_memory_mb() -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return host_peak_rss_mb()


def host_peak_rss_mb() -> float:
    """Peak resident host memory of this process (ru_maxrss)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def host_rss_mb() -> float | None:
    """Resident host memory of this process now (pinned pages included), from /proc/self/statm."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def memory_record() -> dict:
    """Memory figures of a training-log record: device peak (allocated; reserved on CUDA) and host memory."""
    rec = {"peak_mem_mb": round(peak_memory_mb(), 1)}
    if torch.cuda.is_available():
        rec["peak_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    rss = host_rss_mb()
    if rss is not None:
        rec["host_rss_mb"] = round(rss, 1)
    rec["host_peak_rss_mb"] = round(host_peak_rss_mb(), 1)
    return rec


class StepClock:
    """Per-optimizer-step rates: each step's tokens over its wall time (from on_step_begin to on_step_end, with
    the device synchronised, so the data fetch before a step and the saves after it are not counted), the steady
    rate over the steps after the first :attr:`warmup` of this process (compilation, allocator growth, pinned
    buffers and ZeRO's first gathers happen there) and the running rate since training began (all included)."""

    warmup = 2

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.t0 = None
        self.tok0 = 0
        self.steps = 0
        self.step_t = None
        self.step_tok = 0
        self.last_seconds = None
        self.last_tokens = 0
        self.steady_seconds = 0.0
        self.steady_tokens = 0
        self.steady_steps = 0

    def begin_train(self, tokens: int) -> None:
        self.t0 = self.clock()
        self.tok0 = tokens

    def begin_step(self, tokens: int) -> None:
        self.step_t = self.clock()
        self.step_tok = tokens

    def end_step(self, tokens: int) -> None:
        if self.step_t is None:
            return
        self.last_seconds = max(self.clock() - self.step_t, 1e-9)
        self.last_tokens = tokens - self.step_tok
        self.steps += 1
        self.step_t = None
        if self.steps > self.warmup:
            self.steady_seconds += self.last_seconds
            self.steady_tokens += self.last_tokens
            self.steady_steps += 1

    def record(self, tokens: int, world: int = 1) -> dict:
        """``tokens_per_s``: the last step's rate; ``tokens_per_s_steady``: over the steps after warm-up (absent
        before); ``tokens_per_s_running``: since training began; ``step_seconds``; ``seconds`` since the start."""
        dt = max(self.clock() - self.t0, 1e-9) if self.t0 is not None else 1e-9
        rec = {}
        if self.last_seconds is not None:
            rec["tokens_per_s"] = round(self.last_tokens * world / self.last_seconds, 1)
            rec["step_seconds"] = round(self.last_seconds, 3)
        if self.steady_steps:
            rec["tokens_per_s_steady"] = round(self.steady_tokens * world / self.steady_seconds, 1)
            rec["steady_steps"] = self.steady_steps
        rec["tokens_per_s_running"] = round((tokens - self.tok0) * world / dt, 1)
        rec.setdefault("tokens_per_s", rec["tokens_per_s_running"])
        rec["seconds"] = round(dt, 2)
        return rec


class LabelOnlyTrainer(Trainer):
    """compute_loss: the model's forward is :func:`ropescale.training.loss.label_only_forward` (sum of CE over labelled
    positions + count); the sum is normalised by the number of labelled tokens of the whole optimizer step
    (``num_items_in_batch``: all micro-batches and ranks), i.e. the token mean over the global batch."""

    def __init__(self, *a, sequence_layout=None, coverage=None, **kw):
        super().__init__(*a, **kw)
        self.sequence_layout = sequence_layout  # sequence parallelism (ropescale.training.sequence_parallel)
        compat.trainer_takes_token_sums(self)  # we normalise by num_items_in_batch ourselves
        self.tokens_seen = 0
        self.label_tokens_seen = 0
        self.coverage = coverage  # the positions trained (positions.Coverage), or None

    def count_coverage(self, inputs) -> None:
        """Add a micro-batch's position ids to :attr:`coverage` (0 .. T-1 where the batch carries none). A
        sequence-parallel shard counts the whole sample it belongs to, on the group's first rank only
        (``sequence_parallel.COVERAGE_KEY``)."""
        from .sequence_parallel import COVERAGE_KEY

        if self.sequence_layout is not None:
            inputs = inputs.get(COVERAGE_KEY)
            if inputs is None:
                return
        ids = inputs["input_ids"]
        pos = inputs.get("position_ids")
        if pos is None:
            pos = torch.arange(ids.shape[-1]).expand(ids.shape)
        seg, mask = inputs.get("segment_ids"), inputs.get("attention_mask")
        self.coverage.add(pos.cpu(), None if seg is None else seg.cpu(), inputs["labels"].cpu(),
                          None if mask is None else mask.cpu())

    def total_coverage(self):
        """:attr:`coverage` summed over the ranks (a collective: every rank calls it); None without coverage."""
        if self.coverage is None:
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return Coverage.total([self.coverage], self.coverage.context, self.coverage.bins)
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, self.coverage.to_json())
        return Coverage.total([Coverage.from_json(p) for p in parts], self.coverage.context, self.coverage.bins)

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        compat.agree_grad_accum(self)  # no "Gradient accumulation steps mismatch" warning under DeepSpeed

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """transformers' scheduler (``--lr-scheduler``, ``--warmup-steps``), its warm-up shifted by one step so the
        first optimizer step runs at lr / warmup, not at 0 (:func:`compat.warmup_from_first_step`)."""
        made = self.lr_scheduler is None
        sched = super().create_scheduler(num_training_steps, optimizer)
        if made:
            self.lr_scheduler = compat.warmup_from_first_step(sched, self.args.get_warmup_steps(num_training_steps))
        return self.lr_scheduler

    def get_train_dataloader(self):
        dl = super().get_train_dataloader()
        if self.sequence_layout is not None:  # every rank of a sequence group draws the group's batches
            from .sequence_parallel import shard_data_over_groups

            shard_data_over_groups(dl, self.sequence_layout)
        return dl

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # a sequence-parallel shard's extra keys; the positions policy's position / segment ids
        extra = {k: inputs[k] for k in (*SHARD_KEYS, "segment_ids") if k in inputs}
        out = model(input_ids=inputs["input_ids"], labels=inputs["labels"],
                    attention_mask=inputs.get("attention_mask"), **extra)
        if self.coverage is not None and model.training:
            self.count_coverage(inputs)
        self.tokens_seen += int(inputs["input_ids"].numel()) if "attention_mask" not in inputs else \
            int(inputs["attention_mask"].sum())
        self.label_tokens_seen += int(out["n_tokens"])
        if num_items_in_batch is None:
            loss = out["loss_sum"] / out["n_tokens"].clamp(min=1)
        else:
            loss = out["loss_sum"] / num_items_in_batch * compat.token_mean_world_factor(self)
        return (loss, out) if return_outputs else loss


def step_lr(trainer) -> float | None:
    """The learning rate the optimizer step about to run uses (its scheduler's current rate), or None."""
    sched = getattr(trainer, "lr_scheduler", None)
    try:
        if sched is not None:
            return float(sched.get_last_lr()[0])
        return float(trainer.optimizer.param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


class ProgressCallback(TrainerCallback):
    """One line per logging step on stderr (rank 0): step, loss, lr (the rate the step ran with; the Trainer's own
    ``learning_rate`` is the next step's), tokens/s (the last step's, and the steady rate once past warm-up:
    :class:`StepClock`), peak memory; also appended to RUN/train_log.jsonl with the running rate, host memory and the
    memory plan (:mod:`ropescale.training.memory`) when one is set. At the end of training the loss-and-lr PNG of
    the whole log is drawn into the run directory (:func:`.curves.plot_curves`)."""

    def __init__(self, trainer_ref, log_path: Path | None, is_main: bool, world: int):
        self.trainer_ref = trainer_ref
        self.log_path = log_path
        self.is_main = is_main
        self.world = world
        self.clock = StepClock()
        self.bar = None
        self.accum = 1  # micro-batches a step: the bar counts them
        self.lr = None  # the learning rate of the step running

    def on_train_begin(self, args, state, control, **kw):
        self.clock.begin_train(self.trainer_ref().tokens_seen)
        if self.is_main:
            from tqdm import tqdm

            self.accum = max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1)
            self.bar = tqdm(total=state.max_steps * self.accum, initial=state.global_step * self.accum,
                            desc="finetune", unit="micro-batch", file=sys.stderr, dynamic_ncols=True)
            self.bar.set_postfix_str(f"step {state.global_step}/{state.max_steps}", refresh=False)

    def on_step_begin(self, args, state, control, **kw):
        self.clock.begin_step(self.trainer_ref().tokens_seen)
        self.lr = step_lr(self.trainer_ref())

    def on_step_end(self, args, state, control, **kw):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the step's kernels are done: its wall time is its own
        self.clock.end_step(self.trainer_ref().tokens_seen)
        if self.bar is not None:
            self.bar.set_postfix_str(f"step {state.global_step}/{state.max_steps}", refresh=False)
            self.bar.update(state.global_step * self.accum - self.bar.n)

    def on_substep_end(self, args, state, control, **kw):
        """A micro-batch of the step done (all but a step's last): the bar moves within a step (a step of 16
        windows on a CPU takes minutes)."""
        if self.bar is not None:
            self.bar.update(1)

    def on_train_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.log_path is not None and self.log_path.is_file():
            from .curves import plot_curves

            try:
                path = plot_curves(self.log_path.parent)
            except Exception as e:  # a figure must not fail a finished training: say why and go on
                print(f"[finetune] note: the training curves were not drawn: {e}", file=sys.stderr)
            else:
                print(f"[finetune] training curves: {path}", file=sys.stderr)

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:
            return
        tr = self.trainer_ref()
        rec = {"step": state.global_step, "loss": round(float(logs["loss"]), 7),
               "lr": self.lr if self.lr is not None else float(logs.get("learning_rate", 0.0))}
        rec.update(self.clock.record(tr.tokens_seen, self.world))
        rec.update(memory_record())
        plan = getattr(tr.model, "_ropescale_memory", None)
        if plan is not None and hasattr(plan, "record"):
            rec.update(plan.record())
        if "grad_norm" in logs:
            rec["grad_norm"] = round(float(logs["grad_norm"]), 7)
        if self.is_main:
            line = (f"step {rec['step']}/{state.max_steps}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                    f"{rec['tokens_per_s']:.0f} tok/s")
            if "tokens_per_s_steady" in rec:
                line += f" (steady {rec['tokens_per_s_steady']:.0f})"
            line += f"  peak mem {rec['peak_mem_mb']:.0f} MB"
            if torch.cuda.is_available() and "host_rss_mb" in rec:
                line += f"  host {rec['host_rss_mb'] / 1024:.1f} GiB"
            if self.bar is not None:
                self.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                    f.flush()


COVERAGE_JSON = "coverage.json"  # in each checkpoint: the positions trained up to it (a resume continues it)


def start_coverage(context: int, checkpoint: Path | None = None, step: int = 0, log=None):
    """The position coverage a run starts from (``positions.Coverage`` over its extended context):
    empty, or what ``checkpoint`` (at ``step``) recorded (a resume; pass it on one rank only, the counts add over
    ranks). A checkpoint without a coverage record (written before runs kept one) starts the counts at its step
    (``from_step``), said through ``log``."""
    f = None if checkpoint is None else Path(checkpoint) / COVERAGE_JSON
    if f is None:
        return Coverage(context)
    if not f.is_file():
        cov = Coverage(context)
        cov.from_step = int(step)
        if log is not None:
            log(f"[finetune] {checkpoint} holds no position coverage ({COVERAGE_JSON}): the run's coverage counts "
                f"the steps after {cov.from_step} only (recorded as from_step); a fine-tune-aware bound falls back "
                f"to the longest training sample")
        return cov
    from ropescale.common.io import read_json

    cov = Coverage.from_json(read_json(f, "position coverage"), f)
    if cov.context != int(context):
        from ropescale.common.io import InputError

        raise InputError(f"the checkpoint's position coverage is over {cov.context} tokens, this run's context is "
                         f"{context}", f)
    return cov


class CoverageCallback(TrainerCallback):
    """The positions trained (:meth:`LabelOnlyTrainer.total_coverage`): at each checkpoint into
    checkpoint-N/coverage.json and into the run's training record ``record["coverage"]`` (main process; run.json
    and the exports carry it). At each epoch's start, the dataset's epoch (PoSE draws afresh per epoch)."""

    def __init__(self, trainer_ref, record: dict | None, is_main: bool):
        self.trainer_ref = trainer_ref
        self.record = record
        self.is_main = is_main

    def on_epoch_begin(self, args, state, control, **kw):
        ds = self.trainer_ref().train_dataset
        if hasattr(ds, "epoch"):
            ds.epoch = int((state.epoch or 0) + 1e-6)  # the epoch starting (state.epoch: a float, whole here)

    def on_save(self, args, state, control, **kw):
        cov = self.trainer_ref().total_coverage()
        if cov is None or not self.is_main:
            return
        from ropescale.common.io import write_json_atomic

        write_json_atomic(Path(args.output_dir) / f"checkpoint-{state.global_step}" / COVERAGE_JSON, cov.to_json())
        if self.record is not None:
            self.record["coverage"] = cov.to_json()


class ExportCallback(TrainerCallback):
    """After each checkpoint: write the export (adapter + trained tensors + config) into checkpoint-N/export."""

    def __init__(self, trainer_ref, export_kw: dict, is_main: bool):
        self.trainer_ref = trainer_ref
        self.export_kw = export_kw
        self.is_main = is_main

    def on_save(self, args, state, control, **kw):
        tr = self.trainer_ref()
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        export(tr.model, ckpt / "export", step=state.global_step, is_main=self.is_main, **self.export_kw)
        if self.is_main:  # HF writes the adapter through safetensors, which makes it 0600: the umask's mode instead
            share_private_files(ckpt)
