"""Recipes (Table 8 / Table 5 of CNNSum), DeepSpeed configs, settings precedence, and the input errors that must
stop a run before training."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.paths import REPO_ROOT
from ropescale.common.settings import build, spec_by_key
from ropescale.training.cli import TOOL, main
from ropescale.training.config import TrainSettings, load_recipe, settings_from_args
from ropescale.training.run import default_output_dir, ds_config_dict

RECIPES = REPO_ROOT / "recipes"
K = 1024


def parse(argv):
    return settings_from_args(TOOL.parser().parse_args(["train", *argv]))


def from_recipe(path) -> TrainSettings:
    """What a recipe trains with: the defaults under its values."""
    return build(TrainSettings, load_recipe(path))


def test_table8_grid_is_complete_with_the_paper_settings():
    # Table 8: {Qwen1.5-7B, Yi-6B} x {RoPE, PI 2/4/8/16, NTK 2/8/16} x {16K, 32K}; App. B.2 settings
    ctx = {"qwen1.5-7b": 32768, "yi-6b": 4096}  # the models' original contexts (config max_position_embeddings)
    grid = [("none", 1), ("pi", 2), ("pi", 4), ("pi", 8), ("pi", 16), ("ntk", 2), ("ntk", 8), ("ntk", 16)]
    seen = 0
    for model, orig in ctx.items():
        for method, s in grid:
            for length, max_len in (("16k", 18 * K), ("32k", 34 * K)):
                tag = "none" if method == "none" else f"{method}-x{s}"
                r = from_recipe(RECIPES / f"{model}_{tag}_{length}.yaml")
                seen += 1
                assert r.rope.method == method and r.rope.scale == s
                assert r.lr == 2e-5 and r.warmup_steps == 30 and r.lora_r == 8
                assert r.train_embeddings and r.train_norms
                assert r.global_batch == (16 if length == "16k" else 8)
                if length == "32k":  # continued from the 300-step 16K checkpoint
                    assert r.init_from == f"runs/train/{model}-{tag}-16k" and r.init_step == 300
                    assert r.init_from == from_recipe(RECIPES / f"{model}_{tag}_16k.yaml").out
                else:
                    assert r.max_steps >= 500 and r.save_steps <= 100 and 300 % r.save_steps == 0
                # samples longer than orig * s only where the paper trained beyond the extended context
                assert r.allow_extrapolation == (orig * s < max_len), (model, tag, length)
    assert seen == 32


@pytest.mark.parametrize("alpha,beta", [(1, 32), (1, 4), (0.1, 32)])
def test_table5_yarn_recipes(alpha, beta):
    r = from_recipe(RECIPES / f"yi-6b_yarn-x16-a{alpha:g}-b{beta:g}_16k.yaml")
    from rope_scaling import RopeSpec

    assert r.rope == RopeSpec(method="yarn", scale=16, yarn_alpha=alpha, yarn_beta=beta)  # a valid setting


def test_every_recipe_loads():
    files = sorted(RECIPES.glob("*.yaml"))
    assert len(files) == 32 + 3 + 1
    for f in files:
        assert load_recipe(f)


def test_unknown_recipe_key_names_file_and_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("rope: pi\nscale: 4\nlearning_rate: 1e-4\n")
    with pytest.raises(InputError) as e:
        load_recipe(f)
    assert str(e.value).startswith(f"{f}:3:") and "learning_rate" in str(e.value)
    # through the CLI: exit 2, one line, before anything else happens
    assert main(["--recipe", str(f)]) == 2


def test_flags_override_recipe_values(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("model: /some/model\nrope: pi\nscale: 4\nlr: 1.0e-4\nmax_steps: 7\nlora_targets: [q_proj, v_proj]\n")
    a, _ = parse(["--recipe", str(f)])
    assert (a.rope.method, a.rope.scale, a.lr, a.max_steps, a.lora_targets) == ("pi", 4, 1e-4, 7, ["q_proj", "v_proj"])
    a, _ = parse(["--recipe", str(f), "--scale", "8", "--lr", "3e-5", "--lora-targets", "q_proj,k_proj"])
    assert (a.rope.method, a.rope.scale, a.lr, a.max_steps, a.lora_targets) == ("pi", 8.0, 3e-5, 7,
                                                                                ["q_proj", "k_proj"])
    a, _ = parse(["--recipe", str(f), "--scale=8"])
    assert a.rope.scale == 8.0


def test_defaults_and_tiny_demo():
    a, recipe = parse(["--model", "/some/model"])  # a real model: the paper's defaults (App. B.2, Sec 5)
    assert (a.lr, a.warmup_steps, a.lora_r, a.lora_alpha, a.lora_dropout) == (2e-5, 30, 8, 16, 0.05)
    assert a.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj"] and recipe is None
    a, recipe = parse(["--rope", "ntk", "--scale", "8"])  # the tiny default gets the demo recipe: a few steps
    demo = load_recipe(RECIPES / "tiny_demo.yaml")
    assert recipe.endswith("tiny_demo.yaml") and a.max_steps == demo["max_steps"] <= 50  # minutes on a CPU
    assert (a.rope.method, a.rope.scale) == ("ntk", 8.0)


def test_default_output_dir_names():
    from rope_scaling import RopeSpec

    assert default_output_dir("tiny", RopeSpec("ntk", 8)).name == "tiny-ntk-x8"
    assert default_output_dir("/m/Qwen1.5-7B/", RopeSpec("pi", 2.5)).name == "Qwen1.5-7B-pi-x2.5"
    assert default_output_dir("/m/Yi-6B", RopeSpec()).name == "Yi-6B-none"
    assert default_output_dir("tiny", RopeSpec()).parent == Path("runs") / "train"  # under the current directory


def test_ds_configs():
    d = REPO_ROOT / "ds_configs"
    stages = {"zero2": 2, "zero2_offload": 2, "zero3": 3, "zero3_offload": 3}
    for name, stage in stages.items():
        cfg = json.loads((d / f"{name}.json").read_text())
        zo = cfg["zero_optimization"]
        assert zo["stage"] == stage
        for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "gradient_clipping"):
            assert cfg[k] == "auto", (name, k)
        assert cfg["bf16"]["enabled"] == "auto"
        assert ("offload_optimizer" in zo) == name.endswith("offload")
        if name.endswith("offload"):
            assert zo["offload_optimizer"]["device"] == "cpu"
        if stage == 3:
            assert zo["stage3_gather_16bit_weights_on_model_save"] is True
    cpu = ds_config_dict(d / "zero3_offload.json", cuda=False, cpu_adam="auto")
    assert cpu["zero_force_ds_cpu_optimizer"] is False and "optimizer" not in cpu  # torch AdamW, no JIT op
    assert cpu["zero_optimization"]["offload_param"]["pin_memory"] is False
    gpu = ds_config_dict(d / "zero3_offload.json", cuda=True, cpu_adam="auto")
    assert gpu["optimizer"]["type"] == "AdamW" and gpu["optimizer"]["params"]["lr"] == "auto"
    assert "optimizer" not in ds_config_dict(d / "zero2.json", cuda=True, cpu_adam="auto")


def _err(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


def test_unknown_model_path_is_one_clear_error(capsys, tmp_path):
    rc, line = _err(capsys, ["--model", str(tmp_path / "nope"), "--rope", "pi", "--scale", "2"])
    assert rc == 2 and line.startswith("error: ") and "nope" in line and "no such model directory" in line


def test_data_longer_than_the_extended_context(capsys, tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir):
    from ft_helpers import packed

    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=12)
    longest = max(r["length"] for r in __import__("data_concat").load_packed(data))
    # ntk x4 extends the 64-token original context to 256 < the samples
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--rope", "ntk", "--scale", "4",
                             "--out", str(tmp_path / "run")])
    assert rc == 2 and f"{longest} tokens" in line and "256-token context" in line and str(data) in line
    assert not (tmp_path / "run").exists()  # nothing written
    # no scaling at all: the 64-token context
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--output-dir", str(tmp_path / "r2")])
    assert rc == 2 and "64-token context" in line
    # a global batch that the processes cannot split
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--rope", "ntk", "--scale", "8",
                             "--global-batch", "3", "--micro-batch", "2", "--output-dir", str(tmp_path / "r3")])
    assert rc == 2 and "global batch 3" in line


def test_resume_checks_the_run_it_continues(capsys, tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir):
    from ft_helpers import packed

    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=12)
    # checkpoints without a run record: not a run --resume can continue
    (tmp_path / "bare" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "bare" / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--rope", "ntk", "--scale", "8",
                             "--output-dir", str(tmp_path / "bare"), "--resume", "auto"])
    assert rc == 2 and "holds no run" in line and "checkpoint-1" in line  # one line: no run record there
    # a run dir of another rope setting
    run = tmp_path / "other"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "finetune", "model": str(model_dir),
                                              "rope": {"method": "pi", "scale": 8.0}}))
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--rope", "ntk", "--scale", "8",
                             "--output-dir", str(run), "--resume", "auto"])
    assert rc == 2 and re.search(r"rope", line) and "pi" in line


def test_existing_run_dir_is_not_reused_silently(capsys, tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir):
    from ft_helpers import packed

    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=12)
    run = tmp_path / "done"
    (run / "final").mkdir(parents=True)
    rc, line = _err(capsys, ["--model", str(model_dir), "--data", str(data), "--rope", "ntk", "--scale", "8",
                             "--output-dir", str(run)])
    assert rc == 2 and "--resume auto" in line and "--overwrite" in line
    assert (run / "final").is_dir()  # untouched


@pytest.mark.parametrize("text,line,words", [
    ("rope: pi\nscale: eight\n", 2, ["'scale'", "number", "eight"]),
    ("rope: bogus\nscale: 4\n", 1, ["'rope'", "bogus", "ntk"]),
    ("rope: ntk\nscale: 4\norig_ctx: 4k\n", 3, ["'orig_ctx'", "integer"]),
    ("rope: ntk\nscale: 4\norig_ctx: 4096.5\n", 3, ["'orig_ctx'", "integer"]),
    ("rope: yarn\nscale: 4\nyarn_beta: [32]\n", 3, ["'yarn_beta'", "number"]),
    ("rope: ntk\nscale: true\n", 2, ["'scale'", "number"]),
    ("rope: ntk\nscale: 4\nreplace: maybe\n", 3, ["'replace'", "true"]),
    ("rope: ntk\nscale:\n", 2, ["'scale'", "value"]),
    ("rope: pi\nscale: 4\nlora_r: 8.5\n", 3, ["'lora_r'", "integer"]),
    ("rope: pi\nscale: 4\nmax_steps: yes\n", 3, ["'max_steps'", "integer"]),
])
def test_recipe_values_of_the_wrong_type_name_file_and_line(tmp_path, capsys, text, line, words):
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_recipe(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}: "), msg
    for w in words:
        assert w in msg, (w, msg)
    assert main(["--recipe", str(f), "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {msg}"


def test_recipe_rope_values_are_converted():
    import yaml  # noqa: F401 - YAML 1.1 reads 5e6 (no dot) as a string: it is still a number here

    def value(key, v):
        return spec_by_key(TrainSettings)[key].convert(v)

    assert value("rope_base", "5e6") == 5e6 and value("scale", 8) == 8.0
    assert value("orig_ctx", 4096.0) == 4096 and value("replace", "yes") is True
    assert value("rope", "dynamic_ntk") == "dynamic_ntk"
