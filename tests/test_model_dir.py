"""resolve_model / check_model_dir: every wrong --model is one clear line (issue 15), hub ids pass through."""
import json
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.models import check_model_dir, resolve_model


def test_model_dir_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match="without weights"):
        resolve_model(tmp_path)


def test_finetune_run_dir_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "run.json").write_text(json.dumps({"kind": "finetune"}))
    with pytest.raises(InputError, match="finetune run directory.*merge"):
        resolve_model(tmp_path)


def test_no_config_and_file_and_missing(tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        check_model_dir(tmp_path)
    f = tmp_path / "x.bin"
    f.write_bytes(b"")
    with pytest.raises(InputError, match="a file"):
        check_model_dir(f)
    with pytest.raises(InputError, match="no such model directory"):
        resolve_model(tmp_path / "nope")


# ---------------------------------------------------------------- issue 34.1: a missing model never goes to the Hub
class _Hub:
    """HfApi.model_info stand-in: records what it was asked; answers with ``answer`` (an exception is raised)."""

    def __init__(self, answer=None):
        self.asked, self.answer = [], answer

    def model_info(self, repo_id, *, timeout=None, **kw):
        self.asked.append((repo_id, timeout))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return object()


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """Online (no HF_HUB_OFFLINE), in an empty directory, with the Hub replaced by a :class:`_Hub`."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    h = _Hub()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: h)
    return h


@pytest.mark.parametrize("name", ["models/nope", "./nope", "../x/nope", "/abs/nope", "a/b/c", "nope/", "~x/nope"])
def test_a_path_is_never_a_hub_id(hub, tmp_path, name):
    """Not OWNER/NAME, or OWNER is models (the README's layout) or a folder here: a missing directory, one line,
    and the Hub is not asked."""
    (tmp_path / "a").mkdir()
    with pytest.raises(InputError) as e:
        resolve_model(name)
    assert str(e.value).startswith(f"{name.rstrip('/')}: no such model directory (download it with: hf download ")
    assert hub.asked == []


def test_a_missing_recipe_model_names_its_download(hub):
    with pytest.raises(InputError) as e:
        resolve_model("models/Qwen1.5-7B")
    assert str(e.value) == ("models/Qwen1.5-7B: no such model directory (download it with: hf download "
                            "Qwen/Qwen1.5-7B --local-dir models/Qwen1.5-7B)")


def test_hub_id_is_one_the_hub_has(hub):
    """Online, OWNER/NAME goes to transformers only when the Hub has it; asked once, with a time-out."""
    from huggingface_hub.errors import RepositoryNotFoundError

    assert str(resolve_model("Qwen/Qwen1.5-7B")) == "Qwen/Qwen1.5-7B"
    assert hub.asked == [("Qwen/Qwen1.5-7B", 5.0)]
    from types import SimpleNamespace

    hub.answer = RepositoryNotFoundError("404 Client Error", response=SimpleNamespace(headers={}, request=None))
    with pytest.raises(InputError, match=r"^someone/nope: no such model directory, nor a model on the Hugging Face "
                                         r"Hub .*hf download someone/nope --local-dir models/nope, then pass "
                                         r"--model models/nope\)$"):
        resolve_model("someone/nope")
    hub.answer = ConnectionError("[Errno -2] Name or service not known")
    with pytest.raises(InputError, match=r"Hub is not reachable to look it up \(ConnectionError\)"):
        resolve_model("Qwen/Qwen1.5-7B")


def test_offline_a_hub_id_is_one_in_the_cache(hub, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1: only the local HF cache counts (its layout: models--OWNER--NAME/refs + snapshots)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(InputError, match=r"^Qwen/Qwen1.5-7B: no such model directory, nor in the local Hugging Face "
                                         r"cache \(HF_HUB_OFFLINE=1\)"):
        resolve_model("Qwen/Qwen1.5-7B")
    snap = cache / "models--Qwen--Qwen1.5-7B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (cache / "models--Qwen--Qwen1.5-7B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen1.5-7B" / "refs" / "main").write_text("abc")
    assert str(resolve_model("Qwen/Qwen1.5-7B")) == "Qwen/Qwen1.5-7B"
    assert hub.asked == []


def _no_network_env() -> tuple[list[str], dict]:
    """(a command prefix, an environment) without the Hub: a network namespace of its own where the system allows
    one (unshare -n: only a loopback, down), and HF_ENDPOINT on a local port nothing listens on either way."""
    import os
    import shutil
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
    prefix = []
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["unshare", "-n"]
    return prefix, env


@pytest.mark.parametrize("cli", ["generate", "probes", "finetune-recipe", "finetune-hub-id"])
def test_missing_model_without_network_is_one_line_at_once(tmp_path, cli):
    """The issue's four commands with the network unavailable: one line, exit 2, in a few seconds (before: 28 s of
    retries, then an 80-line traceback; the recipe: a 61-line traceback)."""
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parent.parent
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"context": "some text", "summary": "a summary"}, ensure_ascii=False) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((root / "recipes" / "qwen1.5-7b_ntk-x8_16k.yaml").read_text(encoding="utf-8"))
    argv = {
        "generate": [str(root / "eval_summ.py"), "generate", "--model", "models/nope", "--data", str(data), "--prompt",
                     "ie", "--max-new-tokens", "5", "--out", "out"],
        "probes": ["-m", "ropescale", "probes", "ppl", "--model", "models/nope", "--out", "out"],
        "finetune-recipe": [str(root / "finetune.py"), "--recipe", str(recipe)],
        "finetune-hub-id": [str(root / "finetune.py"), "--model", "someone/nope"],
    }[cli]
    want = {"generate": "error: models/nope: no such model directory (download it with: hf download OWNER/NAME "
                        "--local-dir models/nope)",
            "probes": "error: models/nope: no such model directory (download it with: hf download OWNER/NAME "
                      "--local-dir models/nope)",
            "finetune-recipe": "error: models/Qwen1.5-7B: no such model directory (download it with: hf download "
                               "Qwen/Qwen1.5-7B --local-dir models/Qwen1.5-7B)",
            "finetune-hub-id": "error: someone/nope: no such model directory, nor in the local Hugging Face cache "
                               "(HF_HUB_OFFLINE=1) (download it with: hf download someone/nope --local-dir "
                               "models/nope, then pass --model models/nope)"}[cli]
    prefix, env = _no_network_env()
    if cli == "finetune-hub-id":  # finetune.py sets HF_HUB_OFFLINE=1 unless told otherwise; without it: the Hub
        r = subprocess.run(prefix + [sys.executable] + argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert (r.returncode, r.stderr.strip()) == (2, want), r.stderr[-3000:]
        env["HF_HUB_OFFLINE"] = "0"
        want = want.replace("nor in the local Hugging Face cache (HF_HUB_OFFLINE=1)",
                            "and the Hugging Face Hub is not reachable to look it up (ConnectError)")
    t0 = time.perf_counter()
    r = subprocess.run(prefix + [sys.executable] + argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    took = time.perf_counter() - t0
    assert (r.returncode, r.stderr.strip()) == (2, want), r.stderr[-3000:]
    assert took < 15, took  # a few seconds on a shared 2-core machine (interpreter and imports included)
    assert not (tmp_path / "out").exists()


def test_model_dir_with_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    assert check_model_dir(tmp_path) == Path(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # an empty (interrupted) file is not weights
    with pytest.raises(InputError, match="not a whole safetensors file"):
        check_model_dir(tmp_path)
