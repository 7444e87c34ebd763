"""Benchmark of the real fine-tuning path: `deepspeed finetune.py --recipe ...` at several sequence lengths.

For each ``--lengths`` L this runs finetune.py itself as a subprocess (the DeepSpeed launcher, one GPU), on

- a random model of ``--shape`` written to disk once (``7b`` = Qwen1.5-7B: hidden 4096, 32 layers, 32 heads,
  intermediate 11,008, vocab 151,936, q/k/v bias, bf16 safetensors, ~15 GB; ``toy`` = hidden 64, 2 layers, for
  a CPU smoke run; ``7b-2l`` / ``7b-4l``, ``toy-2l`` / ``toy-4l``: the same cut to 2 / 4 decoder layers) with the
  shared Qwen2 tokenizer beside it,
- packed data of exactly L tokens per sample (data_concat's format: ``--pairs`` prompt + summary pairs per sample,
  the summaries ``--label-share`` of it, random token ids),
- the recipe (default ``recipes/qwen1.5-7b_ntk-x8_16k.yaml``: NTK x8 = 262,144-token context, LoRA r=8 +
  embeddings + norms, ZeRO-3 with parameter and optimizer offload) with ``--global-batch 1`` (one sample per
  optimizer step), ``--max-steps --steps``, no checkpoint saves,

and reads RUN/train_log.jsonl: the steady tokens/s (the trainer's rate over the steps after its 2 warm-up steps),
peak GPU memory (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``), the process's peak host RSS,
and what the memory plan was (checkpoint offload, MLP tiling, recompute, blocks); and RUN/run.json: the plan the
run chose with the memory model's numbers behind it, and the attention kernel. It also samples the machine's
available memory while the run lasts (peak host memory used by everything: pinned pages, DeepSpeed's offloaded
parameters and optimizer). ``--baseline`` also runs ``bench/gpu_train_step.py`` (the same training without
DeepSpeed: plain PyTorch, fp32 master copies of the trained tensors on the GPU) at the same lengths, in the same
invocation.

Model, data and results live in ``--workdir`` (default: a temporary directory removed at the end), so a GPU
session with a per-command time limit can run one length per command and print everything at the end:

    python bench/bench_train_path.py --shape 7b --lengths 16384 --workdir /tmp/btp --baseline
    python bench/bench_train_path.py --shape 7b --lengths 262144 --workdir /tmp/btp --steps 3
    python bench/bench_train_path.py --workdir /tmp/btp --report --json
    python bench/bench_train_path.py --shape toy --lengths 256 512          # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ropescale.training.memory.estimate import QWEN15_7B, QWEN15_7B_ROPE

ROOT = Path(__file__).resolve().parent.parent

# This process starts and watches finetune.py (its own entry point prepares itself); it imports torch only to write
# the model, and calls prepare_process() there first (the CUDA allocator setting, quiet libraries), as every entry
# point does before torch: a run on a model already written imports neither torch nor transformers (seconds of CPU).

SHAPES = {
    "7b": QWEN15_7B.hf_kwargs(),  # Qwen1.5-7B (ropescale.training.memory.estimate)
    "toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                intermediate_size=172, vocab_size=151936),
}
# the same shapes cut to 2 and 4 decoder layers (the memory model's per-layer check)
SHAPES.update({f"{k}-{n}l": dict(v, num_hidden_layers=n) for k, v in list(SHAPES.items()) for n in (2, 4)})
ORIG_CTX = QWEN15_7B_ROPE["max_position_embeddings"]  # Qwen1.5-7B's: NTK x8 extends it to 262,144
DEFAULT_RECIPE = ROOT / "recipes" / "qwen1.5-7b_ntk-x8_16k.yaml"
REGULAR_VOCAB = 151643  # Qwen2 ids below the special tokens


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- model and data
def write_model(shape: str, out: Path) -> Path:
    """A random ``shape`` model (Qwen2 architecture, bf16) + the shared Qwen2 tokenizer in ``out`` (kept when a
    complete one of the same shape is there)."""
    marker = out / "bench_model.json"
    if marker.is_file() and json.loads(marker.read_text()).get("shape") == shape:
        return out
    from ropescale.common.process import prepare_process

    prepare_process()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ropescale.common.paths import QWEN2_TOKENIZER

    if out.exists():
        shutil.rmtree(out)
    t0 = time.time()
    cfg = AutoConfig.for_model("qwen2", **SHAPES[shape], max_position_embeddings=ORIG_CTX,
                               rope_theta=QWEN15_7B_ROPE["rope_theta"],
                               tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                               eos_token_id=151643, pad_token_id=151643, bos_token_id=None, use_cache=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):  # random init on the GPU: seconds for 7.7B parameters
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    finally:
        torch.set_default_dtype(prev)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True, max_shard_size="5GB")
    for f in Path(QWEN2_TOKENIZER).iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)
    n = sum(p.numel() for p in model.parameters())
    del model
    (tmp / "bench_model.json").write_text(json.dumps({"shape": shape, "params": n}))
    tmp.rename(out)
    log(f"[bench] wrote a random {shape} model ({n / 1e9:.2f}B parameters) to {out} in {time.time() - t0:.0f} s")
    return out


def write_packed_data(out: Path, length: int, samples: int, *, pairs: int = 6, label_share: float = 0.1,
                      seed: int = 0) -> Path:
    """``samples`` packed samples of exactly ``length`` tokens, each ``pairs`` (prompt, summary) pairs whose
    summaries are ``label_share`` of the tokens, in data_concat's packed format."""
    import numpy as np

    from data_concat.pack import EncodedPair
    from data_concat.packed import TRAIN_FILE, compute_stats, write_packed
    from data_concat.packing import Plan, build_columns

    if (out / TRAIN_FILE).is_file():
        return out
    rng = np.random.default_rng(seed)
    encoded, plan = [], Plan(samples=[], leftover=[], too_long=[])
    seg = length // pairs
    for s in range(samples):
        members = []
        for p in range(pairs):
            n = seg if p < pairs - 1 else length - seg * (pairs - 1)
            k = max(1, int(n * label_share))
            ids = rng.integers(0, REGULAR_VOCAB, n, dtype=np.int32)
            members.append(len(encoded))
            encoded.append(EncodedPair(id=f"s{s}p{p}", prompt_ids=ids[:n - k], target_ids=ids[n - k:]))
        plan.samples.append(members)
    cols = build_columns(encoded, plan)
    sup = [sum(len(encoded[i].target_ids) for i in m) for m in plan.samples]
    stats = compute_stats(cols["length"].tolist(), sup, [len(m) for m in plan.samples], length, length)
    meta = {"format": "ropescale-packed", "format_version": 1, "tokenizer": "qwen2 (random ids)",
            "min": length, "max": length, "target": str(length), "prompt": "bench", "seed": seed,
            "eos_token_id": 151643, "ignore_index": -100, "counts": {"samples": samples}}
    write_packed(out, cols, meta, stats)
    return out


# ---------------------------------------------------------------- one run
class HostMemorySampler:
    """The machine's lowest MemAvailable while a run lasts: peak host memory used = before - lowest."""

    def __init__(self, every: float = 0.5):
        self.every = every
        self.before = self.lowest = self._available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _available() -> int:
        from ropescale.common.host import available_host_bytes

        return available_host_bytes()

    def _loop(self):
        while not self._stop.wait(self.every):
            self.lowest = min(self.lowest, self._available())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def peak_used(self) -> int:
        return max(0, self.before - self.lowest)


def run_group(cmd: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    """Run ``cmd`` in its own process group; past ``timeout`` the whole group (the launcher and the training
    process it started) is stopped. Returns (exit code, 124 on timeout; stdout; stderr)."""
    import signal

    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=30)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        return 124, out or "", (err or "") + f"\ntimed out after {timeout} s"


def finetune_cmd(a, model_dir: Path, data: Path, run_dir: Path) -> list[str]:
    from ropescale.common.process import free_port

    args = ["finetune.py", "--recipe", str(a.recipe), "--model", str(model_dir), "--data", str(data),
            "--output-dir", str(run_dir), "--max-steps", str(a.steps), "--global-batch", "1", "--save-steps",
            "1000000", "--warmup-steps", "0", "--overwrite", *a.ft_arg]
    if a.launcher == "python":
        return [sys.executable, *args]
    launcher = Path(sys.executable).parent / "deepspeed"
    head = [str(launcher)] if launcher.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return head + ["--num_gpus", "1", "--master_port", str(free_port())] + args


def tail_error(stderr: str) -> str:
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    picked = [x for x in lines if "Error" in x or "error:" in x][-2:] or lines[-2:]
    return " | ".join(x.strip() for x in picked)[-400:]


def run_finetune(a, model_dir: Path, work: Path, length: int) -> dict:
    data = write_packed_data(work / "data" / f"packed-{length}", length, a.steps, pairs=a.pairs,
                             label_share=a.label_share)
    run_dir = work / "runs" / f"{a.shape}-{length}"
    cmd = finetune_cmd(a, model_dir, data, run_dir)
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    log(f"[bench] {length} tokens: {' '.join(cmd)}")
    t0 = time.time()
    with HostMemorySampler() as mem:
        rc, out, err = run_group(cmd, env, a.timeout)
    res = {"path": "finetune", "launcher": a.launcher, "shape": a.shape, "seq": length, "rc": rc,
           "wall_seconds": round(time.time() - t0, 1), "host_used_peak_gib": round(mem.peak_used / 2**30, 2)}
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "logs" / f"finetune-{a.shape}-{length}.stderr").write_text(err)
    recs = []
    f = run_dir / "train_log.jsonl"
    if f.is_file():
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    res["steps_done"] = len(recs)
    if recs:
        last = recs[-1]
        res["tokens_per_s_steady"] = last.get("tokens_per_s_steady")
        res["steady_steps"] = last.get("steady_steps", 0)
        res["tokens_per_s_last_step"] = last.get("tokens_per_s")
        res["tokens_per_s_running"] = last.get("tokens_per_s_running")
        res["step_seconds"] = [r.get("step_seconds") for r in recs]
        if any("peak_reserved_mb" in r for r in recs):  # on CUDA (on a CPU peak_mem_mb is the peak RSS)
            res["peak_gpu_gib"] = round(max(r.get("peak_mem_mb", 0) for r in recs) / 1024, 2)
            res["peak_gpu_reserved_gib"] = round(max(r.get("peak_reserved_mb", 0) for r in recs) / 1024, 2)
        res["host_peak_rss_gib"] = round(max(r.get("host_peak_rss_mb", 0) for r in recs) / 1024, 2)
        res["final_loss"] = last.get("loss")
        if "offload_checkpoints" in last:
            res["memory_plan"] = {k: last[k] for k in ("offload_checkpoints", "tile_mlp", "offload_host_mb",
                                                       "recompute_every", "checkpoint_block", "gpu_checkpoints",
                                                       "host_checkpoints") if k in last}
    info = run_info(run_dir)
    for key in ("memory", "attention"):  # the plan chosen with the memory model's numbers; the attention kernel
        if info.get(key):
            res[key] = info[key]
    if rc != 0:
        low = err.lower()
        res["oom"] = "out of memory" in low or "outofmemoryerror" in low
        res["error"] = tail_error(err)
    return res


def run_info(run_dir: Path) -> dict:
    """The run record's ``info`` (run.json; {} where the run wrote none)."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("info") or {}
    except (OSError, ValueError):
        return {}


def run_baseline(a, length: int) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_train_step.py"), "--seq", str(length), "--warmup", "2",
           "--steps", str(max(1, a.steps - 2)), "--label-share", str(a.label_share), "--json"]
    if a.shape == "toy":
        cmd.append("--toy")
    log(f"[bench] {length} tokens, no DeepSpeed: {' '.join(cmd)}")
    t0 = time.time()
    with HostMemorySampler() as mem:
        rc, out, err = run_group(cmd, dict(os.environ), a.timeout)
    res = {"path": "no_deepspeed", "shape": a.shape, "seq": length, "rc": rc,
           "wall_seconds": round(time.time() - t0, 1), "host_used_peak_gib": round(mem.peak_used / 2**30, 2)}
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if lines:
        r = json.loads(lines[-1])["results"][0]
        res.update({k: r[k] for k in ("tokens_per_s", "peak_mem_gib", "oom", "error", "memory_plan",
                                      "seconds_per_step") if k in r})
        res["tokens_per_s_steady"] = r.get("tokens_per_s")
        res["peak_gpu_gib"] = r.get("peak_mem_gib")
    elif rc != 0:
        res["error"] = tail_error(err)
    return res


# ---------------------------------------------------------------- report
def fmt_row(r: dict) -> str:
    name = "finetune.py (DeepSpeed)" if r["path"] == "finetune" else "no DeepSpeed (gpu_train_step)"
    if r.get("oom"):
        what = "OOM" + (f" (peak {r['peak_gpu_gib']} GiB)" if r.get("peak_gpu_gib") else "")
    elif r.get("error") and not r.get("tokens_per_s_steady"):
        what = f"FAILED: {r['error']}"
    else:
        tps = r.get("tokens_per_s_steady")
        what = f"{tps:>9,.0f} tok/s" if tps else f"{'-':>9} tok/s (steady needs >= 3 steps)"
        if r["path"] == "finetune" and r.get("steady_steps"):
            what += f" ({r['steady_steps']} steady steps)"
        if r.get("peak_gpu_gib") is not None:
            what += f"  GPU peak {r['peak_gpu_gib']} GiB"
        if r.get("peak_gpu_reserved_gib"):
            what += f" ({r['peak_gpu_reserved_gib']} reserved)"
        if r.get("host_peak_rss_gib"):
            what += f"  host RSS peak {r['host_peak_rss_gib']} GiB"
    what += f"  host used {r.get('host_used_peak_gib', '-')} GiB"
    plan = r.get("memory_plan")
    if (r.get("memory") or {}).get("describe"):
        what += f"  [{r['memory']['describe']}]"
    elif plan:
        what += f"  [offload {'on' if plan.get('offload_checkpoints') else 'off'}, tile {plan.get('tile_mlp', 0)}]"
    elif r["path"] == "finetune" and r.get("steps_done"):
        what += "  [no memory plan in the log]"
    return f"{r['shape']:>4} seq {r['seq']:>7}  {name:<30} {what}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b", help="model shape (default %(default)s)")
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="tokens per sample (default 16384 32768 65536 131072 262144; toy: 256 512)")
    ap.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="finetune recipe (default %(default)s)")
    ap.add_argument("--steps", type=int, default=4,
                    help="optimizer steps per run, one sample each (default %(default)s: the trainer's 2 warm-up "
                         "steps + 2 steady ones)")
    ap.add_argument("--pairs", type=int, default=6, help="pairs per packed sample (default %(default)s)")
    ap.add_argument("--label-share", type=float, default=0.1, help="share of labelled tokens (default %(default)s)")
    ap.add_argument("--launcher", choices=("deepspeed", "python"), default="deepspeed",
                    help="deepspeed finetune.py (default) or python finetune.py (one process, no launcher)")
    ap.add_argument("--ft-arg", action="append", default=[],
                    help="extra finetune.py argument (repeatable), e.g. --ft-arg=--offload-checkpoints=false")
    ap.add_argument("--baseline", action="store_true",
                    help="also run bench/gpu_train_step.py (no DeepSpeed) at the same lengths")
    ap.add_argument("--workdir", default=None, help="model, data, runs and results.jsonl (kept); default: a "
                                                    "temporary directory, removed at the end")
    ap.add_argument("--report", action="store_true", help="run nothing: print the results recorded in --workdir")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object with every result")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    if a.report and not a.workdir:
        ap.error("--report needs --workdir")
    lengths = a.lengths or ([256, 512] if a.shape == "toy" else [16384, 32768, 65536, 131072, 262144])
    tmp = None
    work = Path(a.workdir) if a.workdir else Path(tmp := tempfile.mkdtemp(prefix="bench_train_path-"))
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.jsonl"
    results: list[dict] = []
    try:
        if a.report:
            results = [json.loads(x) for x in results_file.read_text().splitlines() if x.strip()] \
                if results_file.is_file() else []
        else:
            model_dir = write_model(a.shape, work / f"model-{a.shape}")
            for length in lengths:
                todo = [lambda: run_finetune(a, model_dir, work, length)]
                if a.baseline:
                    todo.append(lambda: run_baseline(a, length))
                for job in todo:
                    r = job()
                    r["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
                    results.append(r)
                    with open(results_file, "a", encoding="utf-8") as f:
                        f.write(json.dumps(r) + "\n")
                    print(fmt_row(r), flush=True)
        if a.report:
            for r in results:
                print(fmt_row(r))
        if a.json:
            print(json.dumps({"results": results}))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if results and all(r["rc"] == 0 or r.get("oom") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
