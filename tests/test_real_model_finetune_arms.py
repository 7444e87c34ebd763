"""experiments/real_model.yaml's fine-tunes (SmolLM2-135M LoRA at x2 on Austen text: PI / NTK / YaRN at 2,048-token
samples, YaRN with PoSE ids to 16,384 on the same samples and steps): the four prepare steps differ only in their
rope and PoSE's target, train on the three novels the held-out windows do not come from, and the quick's chain (2
steps on 128-token samples, the specs' original context 256) merges a model that reloads in plain transformers with
its rope written as transformers' own entries, having trained positions past its samples' length (PoSE) within the
x2 context; the fine-tuned row reads that merged model through the passkey probe like the training-free rows."""
from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from ropescale.common.paths import DATA_DIR, REPO_ROOT

YAML = REPO_ROOT / "experiments" / "real_model.yaml"
HELDOUT = {"emma", "persuasion", "northangerabbey"}


def doc() -> dict:
    return yaml.safe_load(YAML.read_text(encoding="utf-8"))


def test_the_four_fine_tunes_differ_only_in_their_rope_and_pose():
    prep = doc()["prepare"]
    base = prep["ft_yarn"]["run"]
    for step, rope in (("ft_pi", "pi"), ("ft_ntk", "ntk")):
        assert prep[step]["run"] == [rope if a == "yarn" else a for a in base]
    pose = prep["ft_yarn_pose"]["run"]
    i = pose.index("--pose-target")
    assert pose[:i] + pose[i + 2:] == base and pose[i + 1] == "{pose_target}"
    v = doc()["vars"]
    assert not {Path(t).stem for t in v["ft_texts"]} & HELDOUT
    assert all((DATA_DIR / "english" / "austen" / Path(t).name).is_file() for t in v["ft_texts"])
    assert {Path(n).stem for n in v["novels"].split(",")} == HELDOUT
    assert v["ft_steps"] >= 40 and v["ft_samples"] == v["ft_steps"] * v["ft_batch"] and v["ft_len"] == 2048
    assert v["pose_target"] == 2 * v["orig"]
    # every fine-tuned row is read with the training-free rows' flags, on its merged model's own rope
    arms = doc()["arms"]
    for arm, merged in (("ft_pi", "m_pi"), ("ft_ntk", "m_ntk"), ("ft_yarn", "m_yarn"), ("ft_yarn_pose", "m_yarn_pose")):
        run = arms[arm]["run"]
        none = arms["none"]["run"]
        assert run[run.index("--model") + 1] == "{%s}" % merged and "--rope" not in run
        assert run[:3] + run[4:] == none[:3] + none[4:-2], arm


def test_quick_chain_merges_a_model_plain_transformers_reloads(smollm2, tmp_path, capsys, one_thread):
    import torch
    from transformers import AutoModelForCausalLM

    from ropescale.experiments import __main__ as cli

    out = tmp_path / "w"
    assert cli.main(["run", str(YAML), "--quick", "--only", "ft_yarn_pose", "--out", str(out)]) == 0
    capsys.readouterr()
    assert not (out / "train" / "pi-x2-s0").exists()  # a step runs only for the arms that name it
    name = "yarn-x2-pose-s0"
    run = json.loads((out / "train" / name / "run.json").read_text(encoding="utf-8"))
    merged = out / "train" / name / "merged"
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    rope = model.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 2 and rope["original_max_position_embeddings"] == 256
    with torch.no_grad():
        logits = model(input_ids=torch.arange(1, 200).unsqueeze(0)).logits
    assert math.isfinite(float(logits.abs().max()))
    tr = run["train"]
    assert (tr["steps"], tr["global_batch"], tr["lr"], tr["length"]["max"]) == (2, 1, 2e-4, 128)
    assert tr["rope"]["method"] == "yarn" and tr["rope"]["scale"] == 2
    # PoSE: 128-token samples whose ids reach past 127 (the sample length), within the x2 context (512)
    assert 128 <= tr["coverage"]["longest"] < 512 and tr["coverage"]["tokens_beyond"] == 0
    probe = json.loads((out / "runs" / "ft_yarn_pose" / "s0" / "run.json").read_text(encoding="utf-8"))
    assert probe["status"] == "complete" and probe["rope"]["method"] == "yarn"
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["status"] == "complete"
