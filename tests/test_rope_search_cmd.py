"""Issue 32 item 4: ``python -m rope_scaling search`` on a tiny test model (orig 64, head_dim 16: 8 pairs): the run
directory (run.json with the fitness per generation, the search state, a --longrope-factors file), the fitness
against an independent computation (transformers' own ``longrope`` rotary module with the candidate as its long
factors, the loss of the windows' last tokens by hand), resume == one uninterrupted run, other settings refused."""
from __future__ import annotations

import json
import math

import pytest
import torch

from rope_scaling.__main__ import main as rope_main
from rope_scaling.spec import read_longrope_factors
from ropescale.probes.rope_search import STATE

ORIG, SCALE, TARGET, K = 64, 4, 256, 32
SMALL = ["--population", "4", "--parents", "2", "--mutations", "1", "--crossovers", "1", "--windows", "2",
         "--scale", str(SCALE), "--target-len", str(TARGET), "--score-tokens", str(K), "--batch-size", "2"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Tiny forwards on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def setup(make_tiny_model, chapters, tmp_path_factory):
    d = tmp_path_factory.mktemp("search")
    model, model_dir = make_tiny_model("qwen2", orig_ctx=ORIG, seed=3)
    g = torch.Generator().manual_seed(3)  # larger weights than the builder's: a loss that depends on the rope
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(model_dir)
    data = d / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": c["text"]}, ensure_ascii=False) + "\n" for c in chapters[:3]),
                    encoding="utf-8")
    return model_dir, data


def search(setup, out, *extra):
    model_dir, data = setup
    return rope_main(["search", "--model", str(model_dir), "--data", str(data), "--out", str(out), *SMALL,
                      *map(str, extra)])


def test_a_search_run_writes_its_record_state_and_factor_file(setup, tmp_path, capsys):
    assert search(setup, tmp_path / "r", "--evals", 7, "--json") == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert "[search] generation 0: best" in cap.err and "[search] evaluation 7:" in cap.err
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["kind"] == "rope-search" and run["status"] == "complete"
    info = run["info"]
    assert info["evaluations"] == 7 and res["evaluations"] == 7 and info["stopped_by"] == "evaluations"
    assert [c["generation"] for c in info["curve"]][:2] == [0, 1]
    assert all(a["best"] >= b["best"] for a, b in zip(info["curve"], info["curve"][1:]))  # elitist: never worse
    assert set(info["seed_fitness"]) == {"pi", "ntk", "yarn"}
    assert info["best_fitness"] <= min(info["seed_fitness"].values())
    assert len(info["windows"]) == 2 and all(w["tokens"] == TARGET and w["scored"] == K for w in info["windows"])
    f = read_longrope_factors(tmp_path / "r" / "factors.json", rotary_dim=16, monotone=True)
    assert list(f.long_factor) == pytest.approx(info["best_factors"]) and f.short_factor == (1.0,) * 8
    assert max(f.long_factor) <= 1.25 * SCALE and min(f.long_factor) >= 1.0
    state = json.loads((tmp_path / "r" / STATE).read_text())
    assert len(state["evaluated"]) == 7 and state["done"]


def test_the_fitness_is_transformers_longrope_with_the_candidate(setup, tmp_path, capsys):
    """The recorded fitness of the PI and YaRN seeds = the mean loss of each window's last K tokens of the model
    as plain transformers runs it with a written ``longrope`` config whose long factors are that seed (computed
    here with a plain cross-entropy, not the probes' scorer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rope_scaling.search import initial_factors

    model_dir, data = setup
    assert search(setup, tmp_path / "r", "--evals", 3) == 0
    capsys.readouterr()
    info = json.loads((tmp_path / "r" / "run.json").read_text())["info"]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    docs = [json.loads(line)["text"] for line in data.read_text(encoding="utf-8").splitlines()]
    ids = {f"line{i + 1}": tok(t, add_special_tokens=False)["input_ids"] for i, t in enumerate(docs)}
    seeds = initial_factors(16, 10000.0, SCALE, ORIG)
    for name in ("pi", "yarn"):
        cfg = AutoConfig.from_pretrained(str(model_dir))
        cfg.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": float(SCALE),
                               "original_max_position_embeddings": ORIG,
                               "short_factor": [1.0] * 8, "long_factor": seeds[name]}
        cfg.max_position_embeddings = ORIG * SCALE
        m = AutoModelForCausalLM.from_pretrained(str(model_dir), config=cfg, dtype=torch.float32).eval()
        losses = []
        for w in info["windows"]:
            x = torch.tensor([ids[w["doc"]][w["start"]:w["start"] + TARGET]])
            with torch.no_grad():
                logits = m(input_ids=x).logits[0, -K - 1:-1]
            losses.append(torch.nn.functional.cross_entropy(logits, x[0, -K:]).item())
        assert info["seed_fitness"][name] == pytest.approx(sum(losses) / len(losses), abs=2e-4), name
    assert abs(info["seed_fitness"]["pi"] - info["seed_fitness"]["yarn"]) > 0.05  # the check can tell them apart


def test_resume_continues_to_the_same_state_as_one_run(setup, tmp_path, capsys):
    assert search(setup, tmp_path / "whole", "--evals", 10) == 0
    assert search(setup, tmp_path / "part", "--evals", 6) == 0
    assert search(setup, tmp_path / "part", "--evals", 10, "--resume", "auto") == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / n / STATE).read_text()) for n in ("whole", "part"))
    assert a["evaluated"] == b["evaluated"] and a["best"] == b["best"]
    assert [c["best"] for c in a["curve"]] == [c["best"] for c in b["curve"]]


def test_an_existing_run_needs_resume_and_its_own_settings(setup, tmp_path, capsys):
    assert search(setup, tmp_path / "r", "--evals", 3) == 0
    capsys.readouterr()
    assert search(setup, tmp_path / "r", "--evals", 5) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {tmp_path / 'r'}: already holds a rope-search run")
    assert "--resume auto continues it" in err
    assert search(setup, tmp_path / "r", "--evals", 5, "--resume", "never") == 2  # said outright: refused too
    assert "--resume auto continues it" in capsys.readouterr().err
    assert search(setup, tmp_path / "r", "--evals", 5, "--resume", "auto", "--seed", 9) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "seed 0 -> 9" in err
    assert search(setup, tmp_path / "r2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: the search needs a budget: --budget MINUTES and/or --evals N"
    assert not (tmp_path / "r2").exists()
    assert math.isfinite(json.loads((tmp_path / "r" / "run.json").read_text())["info"]["best_fitness"])


@pytest.mark.parametrize("argv", [["search"], None])
def test_search_help_through_both_entries(argv, capsys):
    from ropescale.cli import main as ropescale_main

    with pytest.raises(SystemExit) as e:
        rope_main(["search", "--help"]) if argv else ropescale_main(["rope", "search", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--budget M" in out and "--evals N" in out and "--resume" in out


def test_bad_search_settings_are_one_line_before_any_output(setup, make_tiny_model, tmp_path, capsys):
    from rope_scaling import apply_rope
    from rope_scaling.spec import RopeSpec

    assert search(setup, tmp_path / "a", "--evals", 3, "--target-len", ORIG) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: --target-len {ORIG} must exceed the original context {ORIG} (the long factors apply only " \
                  f"past it)"
    model, scaled = make_tiny_model("qwen2", orig_ctx=ORIG, seed=4)
    apply_rope(model.config, RopeSpec("yarn", 4))
    model.config.save_pretrained(scaled)
    _, data = setup
    assert rope_main(["search", "--model", str(scaled), "--data", str(data), "--out", str(tmp_path / "b"),
                      "--evals", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: {scaled / 'config.json'}: the search starts from an unscaled model; this one carries yarn x4"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
