"""Every generation backend of the registry (``ropescale.evaluation.backends.BACKENDS``), and a toy one registered
by the test itself: each serves a generate run through the same stage code, or refuses it in one line before
anything is written. The toy backend (it echoes the prompt's first tokens) is one class and one registry entry:
no other file knows it, and ``eval_summ generate``'s run record, resume check and predictions work with it."""
from __future__ import annotations

import json

import pytest

from ropescale.common.io import InputError
from ropescale.evaluation.backends import BACKENDS, Backend


class EchoBackend(Backend):
    """A toy backend: each sample's continuation is the first ``max_new_tokens`` ids of its own prompt."""

    name = "echo"
    help = "the prompt's first tokens (a test's backend)"

    def __init__(self, settings):
        self.settings = settings

    @classmethod
    def plan(cls, job):
        return ("echo", job.settings), lambda: cls(job.settings)

    def describe(self) -> dict:
        return {"backend": "echo"}

    def generate(self, items, max_new_tokens, min_new_tokens, on_done) -> None:
        for it in items:
            on_done(it, list(it.input_ids[:max_new_tokens]))


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(BACKENDS, EchoBackend.name, EchoBackend)
    return EchoBackend.name


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=3)[1]


@pytest.fixture
def data(tmp_path, chapters):
    p = tmp_path / "eval.jsonl"
    p.write_text("".join(json.dumps({"id": f"s{i}", "context": chapters[i]["text"][:40], "summary": "x"},
                                    ensure_ascii=False) + "\n" for i in range(2)), encoding="utf-8")
    return p


def _predictions(out) -> list[dict]:
    return [json.loads(x) for x in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", [*BACKENDS, "echo"])
def test_every_backend_serves_a_run_or_refuses_it_in_one_line(name, model_dir, data, tmp_path, request,
                                                                one_thread):
    from ropescale.evaluation.generate import generate

    if name == "echo":  # registered by the test: covered with no other file touched
        request.getfixturevalue("echo")
    out = tmp_path / "run"
    try:
        res = generate(str(model_dir), data, "ie", out, backend=name, max_new_tokens=4, progress=False)
    except InputError as e:
        assert "\n" not in str(e) and "--backend hf" in str(e), str(e)
        assert not (out / "predictions.jsonl").exists()
        return
    preds = _predictions(out)
    assert res["done"] == len(preds) == 2 and {p["id"] for p in preds} == {"s0", "s1"}
    assert all(0 < p["new_tokens"] <= 4 for p in preds)
    info = json.loads((out / "run.json").read_text(encoding="utf-8"))["info"]
    assert info["backend_info"]["backend"] == name


def test_the_toy_backend_is_the_whole_backend(echo, model_dir, data, tmp_path):
    """What the toy backend gets from the registry alone: the --backend check, its prompts' ids as continuations
    (the same tokenized prompt every backend gets), a resume that skips what it wrote."""
    from transformers import AutoTokenizer

    from ropescale.evaluation.generate import Tokenize, generate, load_samples

    out = tmp_path / "run"
    generate(str(model_dir), data, "ie", out, backend=echo, max_new_tokens=3, progress=False)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    contexts = {x["id"]: x["context"] for x in load_samples(data)}
    for p in _predictions(out):
        ids = Tokenize(tok, "ie", "release", False).ids(contexts[p["id"]])
        assert p["new_tokens"] == 3 and p["input_tokens"] == len(ids)
        assert p["prediction"] == tok.decode(ids[:3], skip_special_tokens=True)
    again = generate(str(model_dir), data, "ie", out, backend=echo, max_new_tokens=3, progress=False)
    assert again["generated"] == 0 and again["done"] == 2  # resumed: nothing left to do
