"""One rule for --rope on a model whose config already carries RoPE scaling (issue 15.8), at every entry point:
the same spec again is a no-op, a different spec is refused (InputError) unless --replace, which replaces it.

Entry points: the one config loader of finetune, merge and eval_summ generate (rope_scaling.load.load_config, and
generate itself), the probes' model loader (ropescale.probes.common.load_model), ``python -m rope_scaling describe
--config DIR`` and a whole fine-tune (finetune.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from ropescale.common.io import InputError


@pytest.fixture(scope="module")
def scaled_dir(make_tiny_model, tmp_path_factory):
    """A tiny model whose saved config carries NTK x2 (written by rope_scaling.apply_rope, as finetune merge
    does)."""
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, apply_rope

    _, d = make_tiny_model("qwen2", orig_ctx=64, seed=7)
    out = tmp_path_factory.mktemp("ntk2")
    shutil.copytree(d, out, dirs_exist_ok=True)
    cfg = AutoConfig.from_pretrained(out)
    apply_rope(cfg, RopeSpec("ntk", 2.0))
    cfg.save_pretrained(out)
    return out


SAME = dict(method="ntk", scale=2.0)
OTHER = dict(method="pi", scale=4.0)


def _spec(kind: str):
    from rope_scaling import RopeSpec

    if kind == "same":
        return RopeSpec(**SAME)
    if kind == "other":
        return RopeSpec(**OTHER)
    return RopeSpec(**OTHER, replace=True)


def _flags(kind: str) -> list[str]:
    d = SAME if kind == "same" else OTHER
    return ["--rope", d["method"], "--scale", str(d["scale"])] + (["--replace"] if kind == "replace" else [])


def via_load_config(d, kind):
    from rope_scaling.load import load_config

    eff = load_config(d, _spec(kind)).rope
    return eff.method, eff.scale


def via_probes(d, kind):
    from ropescale.probes.common import load_model

    loaded = load_model(str(d), _spec(kind))
    return loaded.rope["method"], loaded.rope["scale"]


def via_describe(d, kind):
    import contextlib
    import io

    from rope_scaling.__main__ import main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["describe", "--config", str(d), *_flags(kind), "--json"])
    if rc == 2:
        raise InputError(err.getvalue().strip())
    assert rc == 0, err.getvalue()
    out = json.loads(buf.getvalue())
    return out["rope"], out["scale"]


def via_finetune(d, kind):
    from ropescale.training.config import TrainSettings
    from ropescale.training.run import plan_run

    settings = TrainSettings(model=str(d), rope=_spec(kind), out=str(d.parent / "finetune-plan"))  # nothing written
    run = plan_run(settings, recipe=None, resume=None, overwrite=False)
    return run.rope.method, run.rope.scale


ENTRY_POINTS = {"load_config": via_load_config, "probes": via_probes, "describe": via_describe,
                "finetune": via_finetune}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_same_spec_is_a_no_op_other_refused_replace_accepted(scaled_dir, entry):
    fn = ENTRY_POINTS[entry]
    assert fn(scaled_dir, "same") == ("ntk", 2.0)
    with pytest.raises(InputError, match="--replace"):
        fn(scaled_dir, "other")
    assert fn(scaled_dir, "replace") == ("pi", 4.0)


def test_generate_runs_the_saved_spec_again_with_a_note(scaled_dir, chapters, tmp_path):
    """Before issue 15, generate refused even the exact spec the config carries."""
    from ropescale.evaluation.generate import generate

    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"context": chapters[0]["text"][:80], "summary": "x"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    logs = []
    generate(str(scaled_dir), data, "ie", tmp_path / "same", rope=_spec("same"), max_new_tokens=3, progress=False,
             log=logs.append)
    generate(str(scaled_dir), data, "ie", tmp_path / "saved", max_new_tokens=3, progress=False, log=lambda m: None)
    assert any("already carries ntk x2" in m and "no-op" in m for m in logs)
    same, saved = (json.loads((tmp_path / n / "run.json").read_text()) for n in ("same", "saved"))
    assert same["rope"] == saved["rope"] and same["context"] == saved["context"] == 128
    pred = [json.loads((tmp_path / n / "predictions.jsonl").read_text())["prediction"] for n in ("same", "saved")]
    assert pred[0] == pred[1]
    with pytest.raises(InputError, match=r"config\.json: .*--replace"):
        generate(str(scaled_dir), data, "ie", tmp_path / "other", rope=_spec("other"), max_new_tokens=3,
                 progress=False)
    assert not (tmp_path / "other").exists()
