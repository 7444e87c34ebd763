"""bench/gpu_suite.py on its CPU dry run (toy shapes, lengths / 256; by default the lengths above 16K end as the
``--fake-oom-above 16384`` stand-in of a CUDA out-of-memory error): the plan, the step bound, resume after the suite
is killed mid-step, skip-after-OOM and the table (markdown and JSON); its refusals; the CNNSum sample counts it
estimates wall time with.

The dry run is most of this file's time (six steps really run, each in processes that import torch and
transformers: about a minute of CPU). It runs once for the module (:class:`DryRun`, the ``dry`` fixture), in a
thread of its own from the module's first test on, so that the cheaper tests run beside it on the other core; the
tests that read it come last."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ft_helpers import ROOT, run_env

SUITE = ROOT / "bench" / "gpu_suite.py"
sys.path.insert(0, str(SUITE.parent))  # the suite's package, as gpu_suite.py itself puts it there
from gpusuite import plan as gplan  # noqa: E402
from gpusuite import runner, table  # noqa: E402
from gpusuite import steps as suite_steps  # noqa: E402

K = 1024


def _module():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m  # dataclasses look their module up
    spec.loader.exec_module(m)
    return m


def _cmd(work: Path, *extra) -> list[str]:
    return [sys.executable, str(SUITE), "--dry-run", "--workdir", str(work), *map(str, extra)]


def _state(work: Path) -> dict:
    try:
        return json.loads((work / "suite.json").read_text())["steps"]
    except (OSError, json.JSONDecodeError, KeyError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


PLAN = ["env", "prepare", "recipe-16k", "recipe-32k", "recipe-64k", "recipe-128k", "recipe-256k", "recipe-512k",
        "plan-16k", "plan-32k", "plan-64k", "plan-128k", "plan-256k", "plan-512k", "fit-2l", "fit-4l", "tiled-1m-2l",
        "nozero-16k", "nozero-32k", "gen-L", "gen-XL", "gen-2XL", "gen-3XL", "gen-gqa-L", "gen-gqa-XL", "gen-gqa-2XL",
        "gen-gqa-3XL", "fa2-16k", "smollm2-pi-x2", "smollm2-ntk-x2", "smollm2-yarn-x2", "smollm2-pi-x4",
        "smollm2-ntk-x4", "smollm2-yarn-x4"]


class DryRun:
    """``gpu_suite.py --dry-run`` (its defaults) in ``work``, in a thread: started, killed mid-step (while
    ``prepare`` runs), run again to the end with ``--json``, then once more (which must run nothing). What each
    invocation left is kept in :attr:`seen` at the moment it matters (a pid is checked while it cannot have been
    reused)."""

    def __init__(self, work: Path):
        self.work = work
        self.seen: dict = {}
        self.error: BaseException | None = None
        self.proc: subprocess.Popen | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._guarded, name="gpu-suite-dry-run", daemon=True)
        self.thread.start()

    def _guarded(self):
        try:
            self._run()
        except BaseException as e:
            self.error = e

    def _run(self):
        work, env, seen = self.work, run_env(), self.seen
        cmd = _cmd(work)
        first = self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 240
        while _state(work).get("prepare", {}).get("status") != "running":
            if first.poll() is not None or time.time() > deadline or self.stopping:
                first.kill()
                raise AssertionError(f"prepare never ran: {first.communicate()[1][-3000:]}")
            time.sleep(0.1)
        seen["child"] = _state(work)["prepare"]["child"]
        first.send_signal(signal.SIGKILL)  # the suite dies mid-step; its step (its own session) outlives it
        first.wait()
        first.stderr.close()
        st = seen["after_kill"] = _state(work)
        seen["killed_suite_alive"] = _alive(st["prepare"]["pid"])
        seen["resumed"] = self._call(cmd + ["--json"], env, 600)
        seen["child_alive"] = _alive(seen["child"])  # stopped (or finished) before the step ran again
        seen["left_running"] = [x.name for x in Path("/proc").glob("[0-9]*") if _marked(x, work)]
        seen["runs_before_again"] = {k: v.get("runs") for k, v in _state(work).items()}
        seen["again"] = self._call(cmd, env, 120)
        seen["runs_after_again"] = {k: v.get("runs") for k, v in _state(work).items()}

    def _call(self, cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        """subprocess.run, its process kept where :meth:`stop` finds it."""
        if self.stopping:
            raise RuntimeError("stopped")
        p = self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()  # the suite stops its step's process group on SIGTERM
            p.communicate()
            raise
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def stop(self) -> None:
        """A run no test waits for any more (``-x`` after a failure, an interrupt): SIGTERM to the suite, which stops
        its step's processes and records nothing for it."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
        self.thread.join(timeout=60)

    def result(self) -> dict:
        self.thread.join(timeout=900)
        assert not self.thread.is_alive(), "the dry run did not end in 15 minutes"
        if self.error is not None:
            raise self.error
        return self.seen

    def report(self) -> dict:
        p = self.result()["resumed"]
        assert p.returncode == 0, p.stderr[-4000:]
        return json.loads(p.stdout)


@pytest.fixture(scope="module")
def dry(tmp_path_factory, smollm2):  # smollm2: the real model its smollm2-yarn-x2 step fine-tunes
    run = DryRun(tmp_path_factory.mktemp("gpu-suite") / "suite")
    yield run
    if run.thread.is_alive():  # every test that reads it waited for it: none of them ran
        run.stop()


@pytest.fixture(scope="module", autouse=True)
def _dry_run_starts_with_the_module(request):
    """Where a selected test of this module reads the dry run, it starts with the module's first test."""
    if any("dry" in getattr(item, "fixturenames", ()) for item in request.session.items
           if getattr(item, "module", None) is request.module):
        request.getfixturevalue("dry")


def test_the_plan_is_the_issue_s_on_the_gpu_and_in_the_dry_run():
    real, dry = gplan.plan(Path("/w"), dry=False), gplan.plan(Path("/w"), dry=True)
    assert [s.name for s in real] == [s.name for s in dry] == PLAN
    by = {s.name: s for s in real}
    # the recipe path: bench_train_path on the written 7B model, one length a step, NTK x16 past x8's 262,144; the
    # old plan (recipe-N) and the planner's (plan-N)
    for n in (16, 32, 64, 128, 256, 512):
        for which, flags in (("recipe", ["--ft-arg=--memory-plan=recipe", "--ft-arg=--sdpa-backend=default"]),
                             ("plan", ["--ft-arg=--memory-plan=fit"])):
            s = by[f"{which}-{n}k"]
            a = list(s.args)
            assert a[0].endswith("bench_train_path.py") and a[a.index("--lengths") + 1] == str(n * K)
            assert a[a.index("--shape") + 1] == "7b" and s.timeout_flag == "--timeout" and s.group == which
            assert ("--ft-arg=--scale=16" in a) == (n == 512) and "--launcher" not in a  # the deepspeed launcher
            assert all(f in a for f in flags) and "--ft-arg=--memory-plan=fit" not in a[:1]
    # the cut models: 2 and 4 layers at 512K, one step, one plan fixed by hand for both
    for layers in (2, 4):
        a = list(by[f"fit-{layers}l"].args)
        assert a[a.index("--shape") + 1] == f"7b-{layers}l" and a[a.index("--lengths") + 1] == str(512 * K)
        assert a[a.index("--steps") + 1] == "1" and "--ft-arg=--recompute-every=1" in a
        assert "--ft-arg=--offload-checkpoints=false" in a and "--ft-arg=--offload-params=false" in a
    # the 1M step: the 2-layer cut with each layer tiled by sequence (4,096-token chunks), NTK x32
    a = list(by["tiled-1m-2l"].args)
    assert a[a.index("--shape") + 1] == "7b-2l" and a[a.index("--lengths") + 1] == str(1024 * K)
    assert "--ft-arg=--tile-attention=4096" in a and "--ft-arg=--tile-mlp=0" in a and "--ft-arg=--scale=32" in a
    assert gplan.expected_seconds(by["tiled-1m-2l"]) < 540  # one command: 258 s a step by the time model + start-up
    # --only's sets: the first command's steps, then the second's, each in its own order
    assert [s.name for s in gplan.select(real, ["first"])] == ["env", "prepare", "recipe-16k", "plan-16k", "plan-128k"]
    assert [s.name for s in gplan.select(real, ["second"])] == ["plan-32k", "plan-64k", "plan-256k", "fit-2l", "fit-4l",
                                                           "plan-512k"]
    # the no-ZeRO path against plain HF Trainer + PEFT, SDPA (FlashAttention-2 is its own step)
    for n in (16, 32):
        a = list(by[f"nozero-{n}k"].args)
        assert a[0].endswith("gpu_train_step.py") and "--baseline" in a and a[a.index("--seq") + 1] == str(n * K)
        assert a[a.index("--attn") + 1] == "sdpa"
    fa = by["fa2-16k"]
    assert fa.needs == ("cuda", "flash_attn") and list(fa.args)[list(fa.args).index("--attn") + 1] == \
        "flash_attention_2"
    # generation: each CNNSum subset's range [T - a, T + 2K] and budget (the paper's Sec 3.2 and 4.2)
    ranges = {"L": (12 * K, 18 * K, 400), "XL": (26 * K, 34 * K, 400), "2XL": (54 * K, 66 * K, 500),
              "3XL": (112 * K, 130 * K, 500)}
    for prefix, shape in (("gen", "7b"), ("gen-gqa", "7b-gqa")):
        for sub, (lo, hi, new) in ranges.items():
            a = list(by[f"{prefix}-{sub}"].args)
            got = (int(a[a.index("--min-len") + 1]), int(a[a.index("--max-len") + 1]), int(a[a.index("--new-tokens")
                                                                                            + 1]))
            assert got == (lo, hi, new) and a[a.index("--shape") + 1] == shape and a[a.index("--device") + 1] == "cuda"
    # the dry run: the same steps, toy shapes on CPU, lengths / 256
    dby = {s.name: s for s in dry}
    a = list(dby["recipe-512k"].args)
    assert a[a.index("--lengths") + 1] == "2048" and a[a.index("--shape") + 1] == "toy"
    assert dby["recipe-512k"].tokens == 512 * K  # --fake-oom-above compares the nominal length
    assert "--toy" in dby["nozero-16k"].args and "--in-process" in dby["nozero-16k"].args  # one process on CPU
    assert "--in-process" not in by["nozero-16k"].args  # on the GPU each variant's peak memory in its own process
    for prefix, toy in (("gen", "toy-mha"), ("gen-gqa", "toy")):  # bench_generate's toy MHA / GQA shapes
        a = list(dby[f"{prefix}-3XL"].args)
        assert a[a.index("--shape") + 1] == toy and a[a.index("--device") + 1] == "cpu"
    with pytest.raises(Exception, match="unknown step nope"):
        gplan.select(real, ["nope"])
    assert [s.name for s in gplan.select(real, ["recipe", "gen-3XL"])] == PLAN[2:8] + ["gen-3XL"]


def _marked(proc: Path, work: Path) -> bool:
    try:
        return f"ROPESCALE_GPU_SUITE={work.resolve()}".encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def test_a_step_past_the_bound_is_stopped_and_recorded_then_redone(tmp_path):
    work = tmp_path / "bound"
    t0 = time.time()
    p = subprocess.run(_cmd(work, "--only", "prepare", "--step-seconds", 2), cwd=ROOT, env=run_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]  # a time-out is a result, not an error of the suite
    rec = _state(work)["prepare"]
    assert rec["status"] == "failed" and rec["result"]["timed_out"] and rec["error"].startswith("timed out after 2 s")
    assert rec["seconds"] < 2 + 12 and time.time() - t0 < 60
    assert not [x for x in Path("/proc").glob("[0-9]*") if _marked(x, work)]
    assert "| prepare |" in p.stdout and "timed out after 2 s" in p.stdout
    # --redo forgets a step's record: it runs afresh (its run count starts again)
    q = subprocess.run(_cmd(work, "--only", "prepare", "--step-seconds", 2, "--redo", "prepare", "--fake-oom-above",
                            0, "--json"), cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120)
    assert q.returncode == 0 and _state(work)["prepare"]["runs"] == 1


def test_refusals_are_one_line_with_exit_code_2(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "suite.json").write_text('{"format": "ropescale-gpu-suite", "steps": {')
    p = subprocess.run(_cmd(work), cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "suite.json:1" in p.stderr
    (work / "suite.json").write_text(json.dumps({"format": "ropescale-gpu-suite", "dry_run": True, "steps": {}}))
    real = [sys.executable, str(SUITE), "--workdir", str(work)]
    p = subprocess.run(real, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "a dry run's record" in p.stderr
    p = subprocess.run(real[:2] + ["--workdir", str(tmp_path / "fresh")], cwd=ROOT, env=run_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no NVIDIA GPU" in p.stderr  # no GPU on this machine
    p = subprocess.run(_cmd(work, "--only", "recipe-1k"), cwd=ROOT, env=run_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "unknown step recipe-1k" in p.stderr


def test_missing_packages_are_named_with_their_range(monkeypatch):
    import importlib.metadata as md

    real = md.version

    def fake(name):
        if name == "deepspeed":
            raise md.PackageNotFoundError(name)
        return "0.17.0" if name == "peft" else real(name)

    monkeypatch.setattr(md, "version", fake)
    miss = runner.missing_packages()
    assert "deepspeed (>=0.19.3: not installed)" in miss and "peft (>=0.21: 0.17.0 installed)" in miss
    assert len(miss) == 2


def test_cnnsum_counts_estimate_and_count(tmp_path):
    # the release files' sizes over Table 1's mean Yi lengths, scaled to the paper's 695 samples
    sizes = {"L": 12519064, "XL": 25645779, "2XL": 52682557, "3XL": 57516334}
    means = {"L": 15721, "XL": 31844, "2XL": 64303, "3XL": 128751}
    w = {k: sizes[k] / means[k] for k in sizes}
    share = {k: 695 * v / sum(w.values()) for k, v in w.items()}
    est, _ = table.cnnsum_counts(None)
    assert sum(est.values()) == 695 and all(abs(est[k] - share[k]) < 1 for k in est)
    for name, n in (("cnnsum_L_16k", 3), ("cnnsum_XL_32k", 2), ("cnnsum_XXL_64k", 1), ("cnnsum_XXXL_128k", 4)):
        (tmp_path / f"{name}.jsonl").write_text('{"context": "x", "summary": "y"}\n' * n + "\n")
    got, where = table.cnnsum_counts(str(tmp_path))
    assert got == {"L": 3, "XL": 2, "2XL": 1, "3XL": 4} and str(tmp_path) in where


def test_out_of_memory_and_time_outs_are_read_from_each_bench_s_output():
    oom = {"results": [{"path": "finetune", "seq": 262144, "rc": 1, "oom": True, "steps_done": 1,
                        "peak_gpu_gib": 77.9, "error": "torch.OutOfMemoryError: CUDA out of memory."}]}
    r = runner.parse_train_path(json.dumps(oom), "")
    assert r["oom"] == "gpu" and r["steps_done"] == 1 and r["peak_gpu_gib"] == 77.9 and not r["timed_out"]
    slow = {"results": [{"path": "finetune", "seq": 524288, "rc": 124, "error": "timed out after 480 s"}]}
    assert runner.parse_train_path(json.dumps(slow), "")["timed_out"]
    host = {"results": [{"rc": 2, "error": "error: host memory: offloading the checkpoints ... needs 128.0 GiB"}]}
    assert runner.parse_train_path(json.dumps(host), "")["oom"] == "host"
    both = {"results": [{"variant": "ours", "tokens_per_s": 5587.0, "peak_mem_gib": 36.6, "oom": False},
                        {"variant": "baseline", "oom": True, "error": "CUDA out of memory"}]}
    r = runner.parse_train_step(json.dumps(both), "")
    assert "error" not in r and r["baseline"]["oom"] and r["ours"]["tokens_per_s"] == 5587.0  # plain HF's OOM: a result
    assert runner.memory_kind("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "gpu"
    assert runner.memory_kind("ValueError: shapes differ") is None
    assert runner.error_line("Traceback\n  File x\nRuntimeError: boom\nfinetune: 33%|###\n") == "RuntimeError: boom"


def test_the_smoke_check_fails_a_memory_path_that_changes_the_training(monkeypatch, one_thread):
    """The env step's bf16 check passes the memory paths as they are and fails them with a wrong MLP tile (on a
    random model the loss barely moves: the gradients' cosine is what catches it)."""
    import torch

    from ropescale.training.memory import install, tiled_mlp

    ok = suite_steps.smoke(torch.device("cpu"))
    plan = ok["memory_plan"]
    assert ok["ok"] and plan["offload_checkpoints"] and plan["tile_mlp"] == ok["tokens"] // 8
    tile = tiled_mlp.enable_tiled_mlp

    def wrong(model, chunk):
        n = tile(model, chunk)
        for mlp in tiled_mlp.decoder_mlps(model):
            mlp.forward = (lambda f: lambda x: f(x) * 1.5)(mlp.forward)
        return n

    monkeypatch.setattr(install, "enable_tiled_mlp", wrong)
    bad = suite_steps.smoke(torch.device("cpu"))
    assert not bad["ok"] and bad["grad_cosine"] < 0.99 and bad["plain_loss"] == ok["plain_loss"]
    assert ok["variants"]["tiled"]["ok"] and bad["variants"]["tiled"]["ok"]  # the tiled layer has no MLP tiling
    # a tiled layer that fails on the device is a failed check (its error kept), not a crashed env step
    def broken(*a, **k):
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(install, "enable_tiled_attention", broken)
    bad = suite_steps.smoke(torch.device("cpu"))
    assert not bad["ok"] and bad["variants"]["tiled"]["error"] == "RuntimeError: no kernel for this"


def test_the_dry_run_stands_the_longer_lengths_in_as_out_of_memory_unless_all_lengths():
    m = _module()
    a = m.parse_args(["--dry-run"])
    assert a.fake_oom_above == 16 * K and a.fake_oom_default
    a = m.parse_args(["--dry-run", "--all-lengths"])
    assert a.fake_oom_above is None and not a.fake_oom_default
    a = m.parse_args(["--dry-run", "--fake-oom-above", "0"])
    assert a.fake_oom_above == 0 and not a.fake_oom_default
    a = m.parse_args(["--workdir", "/w"])
    assert a.fake_oom_above is None and not a.fake_oom_default  # never on the GPU unless asked
    for bad in (["--workdir", "/w", "--all-lengths"], ["--dry-run", "--all-lengths", "--fake-oom-above", "1"]):
        with pytest.raises(SystemExit) as e:
            m.parse_args(bad)
        assert e.value.code == 2


# ---------------------------------------------------------------- the dry run (once, in the background: see DryRun)
def test_dry_run_killed_mid_step_runs_that_step_again_and_no_done_one(dry):
    seen = dry.result()
    st = seen["after_kill"]
    assert st["env"]["status"] == "done" and st["prepare"]["status"] == "running" and not seen["killed_suite_alive"]
    rep = dry.report()
    assert rep["complete"] and rep["dry_run"]
    assert not seen["child_alive"]  # the killed suite's step was stopped before the step ran again
    steps = rep["steps"]
    assert steps["env"]["runs"] == 1 and steps["prepare"]["runs"] == 2  # the done step kept, the cut-off one again
    assert not seen["left_running"]  # nothing left running
    again = seen["again"]  # run once more: nothing runs again, the table is printed
    assert again.returncode == 0, again.stderr[-2000:]
    assert seen["runs_after_again"] == seen["runs_before_again"] == {k: v.get("runs") for k, v in steps.items()}
    assert "| gen-gqa-3XL |" in again.stdout and "complete" in again.stdout.splitlines()[0]


def test_dry_run_steps_run_the_real_benches_and_their_results_are_read(dry):
    steps = dry.report()["steps"]
    assert all(steps[n]["status"] == "done" for n in ("env", "prepare", "recipe-16k", "plan-16k", "fit-2l",
                                                      "nozero-16k", "gen-L", "gen-gqa-L"))
    r = steps["recipe-16k"]["result"]
    assert r["steps_done"] == 2 and r["tokens_per_s_last_step"] > 0 and r["model_estimate_gib"] > 0
    assert r["memory"]["plan"]["name"] == "recipe" and r["attention"]["sdpa_backend"] == "default"
    p = steps["plan-16k"]["result"]  # the planner's plan, its own estimate beside the measurement
    assert p["memory"]["plan"]["name"] == "fit" and p["model_estimate_gib"] == round(
        p["memory"]["estimate_gib"]["peak"], 2)
    f = steps["fit-2l"]["result"]  # the 2-layer cut with the plan fixed by hand
    assert f["shape"] == "toy-2l" and f["memory"]["plan"]["recompute_every"] == 1 and f["steps_done"] == 1
    assert f["memory"]["plan"]["offload_params"] is False and f["memory"]["plan"]["head_chunk_zero3"] is True
    n = steps["nozero-16k"]["result"]
    assert n["ours"]["tokens_per_s"] > 0 and n["baseline"]["tokens_per_s"] > 0 and n["model_estimate_gib"] > 0
    for name in ("gen-L", "gen-gqa-L"):
        g = steps[name]["result"]
        assert g["ours"]["samples_per_hour"] > 0 and g["baseline"]["samples_per_hour"] > 0, name
    sm = steps["env"]["result"]["smoke"]
    assert sm["ok"] and sm["dtype"] == "bfloat16" and set(sm["variants"]) == {"recipe", "blocks", "selective",
                                                                              "tiled"}
    assert sm["variants"]["tiled"]["memory_plan"]["tile_attention"] == sm["tokens"] // 8
    assert sm["variants"]["blocks"]["memory_plan"]["checkpoint_block"] == 2


def test_dry_run_skips_the_longer_lengths_after_an_out_of_memory_error(dry):
    steps = dry.report()["steps"]
    # the dry run's default stand-in above 16K: that step failed as OOM, the longer ones of its group skipped
    for group, oom, skipped in (("recipe", "recipe-32k", ["recipe-64k", "recipe-128k", "recipe-256k", "recipe-512k"]),
                                ("plan", "plan-32k", ["plan-64k", "plan-128k", "plan-256k", "plan-512k"]),
                                ("fit", "fit-4l", []), ("nozero", "nozero-32k", []),
                                ("gen", "gen-XL", ["gen-2XL", "gen-3XL"]),
                                ("gen-gqa", "gen-gqa-XL", ["gen-gqa-2XL", "gen-gqa-3XL"])):
        assert steps[oom]["status"] == "failed" and steps[oom]["result"]["oom"] == "gpu", (group, steps[oom])
        assert "out of memory" in steps[oom]["error"].lower() and "fake OOM" in steps[oom]["note"]
        assert "default --fake-oom-above 16384" in steps[oom]["note"]
        assert steps[oom]["simulated"]  # the table says "simulated", not "failed"
        for s in skipped:
            assert steps[s]["status"] == "skipped" and "simulated out-of-memory" in steps[s]["why"]
    assert steps["fa2-16k"]["status"] == "skipped" and "CUDA" in steps["fa2-16k"]["why"]


def test_dry_run_table_has_a_row_per_step_and_the_cnnsum_estimate(dry):
    rep = dry.report()
    g = rep["steps"]["gen-L"]["result"]
    # the table: one row a step, every row the header's width; the CNNSum estimate where a subset ran
    assert rep["header"][:3] == ["step", "what", "status"] and [row[0] for row in rep["rows"]] == PLAN
    assert all(len(row) == len(rep["header"]) for row in rep["rows"])
    est = {(e["shape"], e["side"]): e for e in rep["cnnsum"]["estimates"]}
    ours = est[("7B MHA", "eval_summ hf backend")]
    assert ours["hours"]["L"] == pytest.approx(193 * 2 / g["ours"]["samples_per_hour"], rel=0.01)
    assert ours["hours"]["XL"] == "OOM" and ours["total_hours"] is None
    assert isinstance(est[("7B GQA", "plain generate")]["hours"]["L"], float)
    md = (dry.work / "suite.md").read_text()
    assert md.startswith("GPU suite (DRY RUN") and "| step | what | status |" in md
    # the stand-ins read as simulated: the header counts them apart, no row calls them failed or out of memory
    head = md.splitlines()[0]
    # one per group but fa2, and SmolLM2's x2 PI / NTK (yarn x2 stands for them) and YaRN x4
    assert "0 failed" in head and "10 simulated" in head and rep["counts"]["simulated"] == 10
    assert "| failed |" not in md and "OUT OF MEMORY" not in md
    assert sum(1 for line in md.splitlines() if line.startswith("| recipe-")) == 6


def test_smollm2_full_length_steps_on_the_gpu_and_in_the_dry_run(dry):
    """SmolLM2-135M fine-tuned at full length (bench/gpusuite/smollm2.py): on the GPU LoRA x2 at 16,384 and x4 at
    32,768 tokens for PI, NTK and YaRN, trained on novels the real-model windows never come from; the dry run
    fine-tunes yarn x2 for real (512 tokens, 1 step), merges it and reads the merged model and the base model with
    YaRN x2 training-free on a held-out window's passkeys."""
    import importlib

    by = {s.name: s for s in gplan.plan(Path("/w"), dry=False)}
    sm = importlib.import_module("gpusuite.smollm2")
    novels = __import__("yaml").safe_load((ROOT / "experiments" / "real_model.yaml").read_text())["vars"]["novels"]
    assert set(sm.HELDOUT) == {Path(n).stem for n in novels.split(",")}  # the real-model table's windows
    assert not set(sm.TRAIN) & set(sm.HELDOUT) and len(sm.TRAIN) == 3
    for meth in ("pi", "ntk", "yarn"):
        for scale, n in ((2, 16 * K), (4, 32 * K)):
            s = by[f"smollm2-{meth}-x{scale}"]
            a = list(s.args)
            assert a[0].endswith("smollm2.py") and a[a.index("--method") + 1] == meth and "--dry-run" not in a
            assert a[a.index("--scale") + 1] == str(scale) and s.tokens == n and s.group == f"smollm2-{meth}"
            cfg = sm.settings(scale, dry=False)
            assert cfg["length"] == n and cfg["global_batch"] * n == 65536 and cfg["eval_lengths"][-1] == n
            assert gplan.expected_seconds(s) is not None
    assert [s.name for s in gplan.select(list(by.values()), ["next1"])] == ["env", "prepare", "plan-256k", "fit-2l"]
    steps = dry.report()["steps"]
    r = steps["smollm2-yarn-x2"]
    assert r["status"] == "done", r
    res = r["result"]
    assert res["method"] == "yarn" and res["length"] == 512 and res["train"]["steps"] == 1
    assert res["windows"] == ["emma"] and set(res["finetuned"]["passkey"]) == {"256", "512"}
    for side in ("finetuned", "training_free"):
        assert 0 < res[side]["loss_in_window"] < 20 and set(res[side]["answer_loss"]) == {"256", "512"}
    assert steps["smollm2-pi-x2"].get("simulated") and steps["smollm2-yarn-x4"].get("simulated")
    assert steps["smollm2-pi-x4"]["status"] == "skipped"


def test_expected_seconds_come_from_the_time_model_and_the_start_up():
    from ropescale.training.memory import plan as planner
    from ropescale.training.memory.estimate import QWEN15_7B, Setup

    by = {s.name: s for s in gplan.plan(Path("/w"), dry=False)}
    # measured on the H200 (docs/gpu/suite-h200-2026-11-27.json): recipe-16k 90.5 s, recipe-128k 324.6 s
    assert gplan.expected_seconds(by["recipe-16k"]) == pytest.approx(90.5, rel=0.1)
    assert gplan.expected_seconds(by["recipe-128k"]) == pytest.approx(324.6, rel=0.02)
    # plan-16k: the start-up (60 s, nothing pinned: weights and optimizer on the GPU) + 4 of the planner's steps
    c = planner.choose(QWEN15_7B, Setup(length=16 * K), planner.H200)
    assert gplan.expected_seconds(by["plan-16k"]) == pytest.approx(60 + 4 * c.seconds["step"], abs=0.1)
    assert gplan.expected_seconds(by["gen-L"]) is None and gplan.expected_seconds(by["env"]) == 30


def test_mfu_and_the_run_s_own_estimate_beside_a_measurement(tmp_path):
    from gpusuite.runner import Context, add_estimate

    step = {s.name: s for s in gplan.plan(tmp_path, dry=False)}["recipe-16k"]
    ctx = Context(tmp_path, False, "NVIDIA H200, 143771 MiB", 540)
    res = add_estimate(step, {"tokens_per_s_steady": 5864.7, "memory": {"estimate_gib": {"peak": 9.9265,
                                                                                          "at": "layer"}}}, ctx)
    # 6.4042e14 model FLOPs (tests/test_memory_planner.py) in 16,384 / 5,864.7 s over 989.4 TFLOP/s
    assert res["mfu"] == pytest.approx(0.2317, abs=1e-4) and res["model_estimate_gib"] == 9.93
    cpu = add_estimate(step, {"tokens_per_s_steady": 100.0}, Context(tmp_path, False, "cpu", 540))
    assert "mfu" not in cpu and cpu["model_estimate_gib"] > 0  # no peak to divide by; the estimate rebuilt


def test_the_cut_models_give_the_per_layer_slope_and_constant(tmp_path):
    from gpusuite.table import fit_check

    suite = runner.Suite(tmp_path, dry=False)
    for n, peak, model in ((2, 104.0, 105.0), (4, 112.5, 113.76)):
        suite.steps[f"fit-{n}l"] = {"status": "done", "result": {"peak_gpu_gib": peak, "model_estimate_gib": model}}
    f = fit_check(suite)
    # slope (112.5 - 104) / 2 = 4.25 measured, (113.76 - 105) / 2 = 4.38 modelled: +3.1%; constant 104 - 2 x 4.25 =
    # 95.5 measured, 105 - 2 x 4.38 = 96.24 modelled: +0.8%
    assert f == {"slope_gib": 4.25, "slope_model_gib": 4.38, "slope_error": 0.0306, "constant_gib": 95.5,
                 "constant_model_gib": 96.24, "constant_error": 0.0077}
    suite.steps["fit-4l"]["status"] = "failed"
    assert fit_check(suite) is None


def test_a_step_expected_to_outlast_the_budget_is_not_started(tmp_path, capsys):
    from gpusuite.runner import Context, run_plan

    full = gplan.plan(tmp_path, dry=False)
    step = {s.name: s for s in full}["plan-128k"]  # ~205 s expected on an H200
    suite = runner.Suite(tmp_path, dry=False)
    ctx = Context(tmp_path, False, "NVIDIA H200, 143771 MiB", 540, max_seconds=200, gpu_gib=140.4)
    assert run_plan(suite, [step], full, ctx) == "budget"  # it would get 200 - 40 = 160 s: nothing spawned
    assert "plan-128k" not in suite.steps and "expected to take ~205 s" in capsys.readouterr().err
