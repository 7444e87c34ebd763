"""The config is read into a RoPE spec once per stage (issue 35.1): ``rope_scaling.load.load_config`` returns one
object (config, change, state, extended context) that finetune, generate and the probes pass on.

The reads are counted by wrapping ``rope_scaling.hf.rope_state`` (the one reader of a config into a spec:
``read_rope``, ``extended_context`` and ``plan_rope`` go through it) wherever a module holds it. Before the issue a
one-step fine-tune read the config 6 times (5 with ``--data``), a one-sample generate 5 times."""
from __future__ import annotations

import json
import sys

import pytest
from ft_helpers import packed

from rope_scaling import RopeSpec

SPECS = [RopeSpec(), RopeSpec("pi", 4), RopeSpec("ntk", 8), RopeSpec("dynamic_ntk", 2), RopeSpec("yarn", 8),
         RopeSpec("yarn", 4, yarn_mscale=1.5, yarn_alpha=2.0), RopeSpec("abf", 1, rope_base=80000.0),
         RopeSpec("pi", 2, rope_base=50000.0)]


@pytest.fixture
def reads(monkeypatch):
    """The list of configs read into a RoPE spec while the test runs (one entry a read)."""
    import rope_scaling.hf as hf

    original, calls = hf.rope_state, []

    def counting(cfg):
        calls.append(cfg)
        return original(cfg)

    for mod in list(sys.modules.values()):  # every module that bound the reader under its own name
        if getattr(mod, "rope_state", None) is original:
            monkeypatch.setattr(mod, "rope_state", counting)
    return calls


def _configs(make_tiny_model):
    """A plain tiny config, in the transformers 5.x object and in a 4.x-layout dict."""
    from transformers import AutoConfig

    _, d = make_tiny_model("qwen2", orig_ctx=64, seed=21)
    cfg = AutoConfig.from_pretrained(d)
    theta = cfg.rope_parameters["rope_theta"]
    old = {k: v for k, v in cfg.to_dict().items() if k != "rope_parameters"}
    old.update(rope_theta=theta, rope_scaling=None)
    return d, cfg, old


@pytest.mark.parametrize("layout", ["5.x", "4.x"])
def test_the_state_change_rope_returns_is_what_the_config_reads_back(make_tiny_model, layout):
    """What ``change_rope`` says the config carries after each action (applied, replaced, removed, unchanged,
    kept) is what reading the written config gives: the reader is the reference."""
    import copy

    from rope_scaling.hf import change_rope, extended_context, rope_state

    _, cfg5, cfg4 = _configs(make_tiny_model)
    plain = cfg5 if layout == "5.x" else cfg4
    seen = set()
    for first in SPECS:
        scaled = copy.deepcopy(plain)
        change, st = change_rope(scaled, first)
        seen.add(change.action)
        assert st == rope_state(scaled) and extended_context(scaled, st) == extended_context(scaled)
        for then in [first, RopeSpec(), RopeSpec(replace=True), RopeSpec("pi", 4, replace=True),
                     RopeSpec("yarn", 8, replace=True)]:
            cfg = copy.deepcopy(scaled)
            if first.method != "none" and then.method != "none" and not then.replace and not then.same_rope(first):
                continue  # stacking is refused (test_rope_stacking)
            change, st = change_rope(cfg, then)
            seen.add(change.action)
            assert st == rope_state(cfg), (first.label(), then.label(), change.action)
            assert extended_context(cfg, st) == extended_context(cfg)
    assert seen == {"kept", "applied", "unchanged", "replaced", "removed"}


def test_load_config_reads_once_and_carries_everything(make_tiny_model, reads):
    from rope_scaling.load import load_config

    d, _, _ = _configs(make_tiny_model)
    cfg = load_config(d, RopeSpec("yarn", 8))
    assert len(reads) == 1
    assert (cfg.rope.method, cfg.rope.scale, cfg.orig_ctx, cfg.context) == ("yarn", 8.0, 64, 512)
    assert cfg.change.action == "applied" and cfg.path == d
    fields = cfg.rope_fields()
    assert fields["max_position_embeddings"] == 512 and fields["rope_parameters"]["rope_type"] == "yarn"
    assert load_config(d).rope_fields() == {}  # kept as saved: nothing for vLLM to override


@pytest.mark.parametrize("data", ["--data", "default data"])
def test_a_one_step_finetune_reads_the_config_once(make_tiny_model, chapters, tiny_tokenizer_dir, tmp_path,
                                                   monkeypatch, reads, data):
    import ropescale.training.data as tdata
    from ropescale.training.cli import main

    _, model_dir = make_tiny_model(orig_ctx=128, seed=22)
    args = ["--model", model_dir, "--rope", "ntk", "--scale", "8", "--max-steps", "1", "--global-batch", "1",
            "--save-steps", "10", "--out", tmp_path / "run"]
    if data == "--data":
        args += ["--data", packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=6)]
    else:  # built from the novels for this model, into a cache of its own
        monkeypatch.setattr(tdata, "CACHE_DIR", tmp_path / "cache")
        args += ["--default-data-factor", "6"]  # samples of ~6x the 128-token context
    reads.clear()  # building the packed set above reads no config; count from the command on
    assert main([str(a) for a in args]) == 0
    assert len(reads) == 1
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["rope"]["method"] == "ntk" and meta["context"] == 1024 and meta["train"]["steps"] == 1


def test_a_one_sample_generate_reads_the_config_once(make_tiny_model, chapters, tmp_path, reads):
    from ropescale.evaluation.generate import generate

    _, model_dir = make_tiny_model(orig_ctx=64, seed=23)
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"context": chapters[0]["text"][:60], "summary": "x"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    res = generate(str(model_dir), data, "ie", tmp_path / "gen", rope=RopeSpec("yarn", 4), max_new_tokens=3,
                   min_new_tokens=0, progress=False, log=lambda m: None)
    assert res["done"] == 1 and len(reads) == 1
    meta = json.loads((tmp_path / "gen" / "run.json").read_text())
    assert meta["rope"]["method"] == "yarn" and meta["context"] == 256


def test_a_probe_reads_the_config_once(make_tiny_model, reads):
    from ropescale.probes.common import load_model

    _, model_dir = make_tiny_model(orig_ctx=64, seed=24)
    loaded = load_model(str(model_dir), RopeSpec("pi", 2))
    assert len(reads) == 1
    assert (loaded.rope["method"], loaded.scale, loaded.orig_ctx, loaded.context) == ("pi", 2.0, 64, 128)
