"""The real-model fine-tune rows' prepare steps (SmolLM2-135M LoRA at x2 on Austen text: PI / NTK / YaRN at 2,048-token
samples, YaRN with PoSE ids to 16,384 on the same samples and steps), run by the experiments runner at a miniature
size on the tiny default (2 steps, 128-token samples, its 512-token window x2): each merged model reloads in plain
transformers with its rope written as transformers' own entries, and the positions it trained are those its
recipe names (PoSE's past the 128-token sample length, within 1,024); the miniature runs the PoSE arm's chain, the
other three arms are the same step with one flag changed (checked on the fragment). The fragment (FRAGMENT, also in
/tmp/h5/finetune_arms.yaml) is what experiments/real_model.yaml takes; the eval arms here are only the miniature's."""
from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from ropescale.common.paths import DATA_DIR

FRAGMENT = """\
vars:
  ft_texts:             # the three novels the held-out windows (Emma, Persuasion, Northanger Abbey) do not come from
    - ../shared/data/english/austen/mansfieldpark.txt
    - ../shared/data/english/austen/prideprejudice.txt
    - ../shared/data/english/austen/sensesensibility.txt
  ft_len: 2048          # tokens a training sample: positions <= 2K (Liu et al.'s premise: a new rope, trained short)
  ft_samples: 40        # = ft_steps x ft_batch: each sample once, the files in turn (data text)
  ft_steps: 40          # the same for every arm
  ft_batch: 1
  ft_lr: 2.0e-4         # LoRA r = 8 + embeddings and norms (finetune.py's recipe); 40 steps, not CNNSum's 2e-5 x 100s
  ft_warmup: 4
  pose_target: 16384    # PoSE's ids reach orig x 2 on the same 2K samples (Zhu et al. 2023)
  ft_args: [--save-steps, 10, --save-total-limit, 1, --gradient-checkpointing, "false"]   # resumable every 10
                        # steps; no recompute (2K on the CPU: 7 GB, a step ~25 % less CPU than recomputing)
prepare:                # once a seed: the training set, each arm's fine-tune and its merged model
  ft_text:
    out: "data/austen-ft-s{seed}"
    run: [data, text, --tokenizer, "{model}", --length, "{ft_len}", --n, "{ft_samples}", "{ft_texts}", --out, "{out}"]
  ft_pi:
    out: "train/pi-x2-s{seed}"
    run: [finetune, --model, "{model}", --data, "{ft_text}", --rope, pi, --scale, 2, --max-steps, "{ft_steps}",
          --global-batch, "{ft_batch}", --lr, "{ft_lr}", --warmup-steps, "{ft_warmup}", --seed, "{seed}",
          --out, "{out}", --resume, auto, "{ft_args}"]
  m_pi: {out: "train/pi-x2-s{seed}/merged", run: [finetune, merge, --run, "{ft_pi}", --out, "{out}"]}
  ft_ntk:
    out: "train/ntk-x2-s{seed}"
    run: [finetune, --model, "{model}", --data, "{ft_text}", --rope, ntk, --scale, 2, --max-steps, "{ft_steps}",
          --global-batch, "{ft_batch}", --lr, "{ft_lr}", --warmup-steps, "{ft_warmup}", --seed, "{seed}",
          --out, "{out}", --resume, auto, "{ft_args}"]
  m_ntk: {out: "train/ntk-x2-s{seed}/merged", run: [finetune, merge, --run, "{ft_ntk}", --out, "{out}"]}
  ft_yarn:
    out: "train/yarn-x2-s{seed}"
    run: [finetune, --model, "{model}", --data, "{ft_text}", --rope, yarn, --scale, 2, --max-steps, "{ft_steps}",
          --global-batch, "{ft_batch}", --lr, "{ft_lr}", --warmup-steps, "{ft_warmup}", --seed, "{seed}",
          --out, "{out}", --resume, auto, "{ft_args}"]
  m_yarn: {out: "train/yarn-x2-s{seed}/merged", run: [finetune, merge, --run, "{ft_yarn}", --out, "{out}"]}
  ft_yarn_pose:
    out: "train/yarn-x2-pose-s{seed}"
    run: [finetune, --model, "{model}", --data, "{ft_text}", --rope, yarn, --scale, 2, --max-steps, "{ft_steps}",
          --global-batch, "{ft_batch}", --lr, "{ft_lr}", --warmup-steps, "{ft_warmup}", --seed, "{seed}",
          --pose-target, "{pose_target}", --out, "{out}", --resume, auto, "{ft_args}"]
  m_yarn_pose:
    out: "train/yarn-x2-pose-s{seed}/merged"
    run: [finetune, merge, --run, "{ft_yarn_pose}", --out, "{out}"]
quick:
  vars: {model: tiny, ft_texts: [../shared/data/english/austen/prideprejudice.txt], ft_len: 128, ft_samples: 2,
         ft_steps: 2, ft_warmup: 0, pose_target: 1024, ft_args: [--save-steps, 1]}
"""
ARMS = {"pi": "m_pi", "ntk": "m_ntk", "yarn": "m_yarn", "yarn-pose": "m_yarn_pose"}
RUN = ["ft-yarn-pose"]  # the miniature runs the PoSE arm's chain; the other three are its step less --pose-target
# (YaRN) with --rope pi / ntk (test_the_four_arms_differ_only_in_their_rope_and_pose)


def experiment(tmp: Path) -> Path:
    """FRAGMENT as an experiment file with a position-loss arm a merged model; the miniature's texts are short."""
    frag = yaml.safe_load(FRAGMENT)
    small = []
    for name in ("prideprejudice", "emma"):
        f = tmp / f"{name}.txt"
        f.write_text((DATA_DIR / "english" / "austen" / f"{name}.txt").read_text(encoding="utf-8")[:3000],
                     encoding="utf-8")
        small.append(f)
    quick = dict(frag["quick"]["vars"], ft_texts=[str(small[0])], heldout=str(small[1]))
    arms = {f"ft-{a}": {"label": a, "run": ["probes", "position-loss", "--model", "{%s}" % m, "--data", "{heldout}",
                                            "--window", "256", "--bucket", "64", "--n", "1"]}
            for a, m in ARMS.items()}
    exp = {"name": "ft_arms", "title": "fine-tune arms", "about": "the miniature", "seeds": [0], "lengths": [0],
           "vars": dict(frag["vars"], model="models/smollm2-135m", heldout=""), "prepare": frag["prepare"],
           "score": {"name": "loss", "file": "items.jsonl", "field": "loss", "id": "window", "length": "bucket",
                     "unit": "window", "column": "pos "},
           "arms": arms, "quick": {"vars": quick, "arms": RUN}}
    path = tmp / "ft_arms.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    return path


def test_the_four_arms_differ_only_in_their_rope_and_pose():
    prep = yaml.safe_load(FRAGMENT)["prepare"]
    base = prep["ft_yarn"]["run"]
    for step, rope in (("ft_pi", "pi"), ("ft_ntk", "ntk")):
        assert prep[step]["run"] == [rope if a == "yarn" else a for a in base]
    pose = prep["ft_yarn_pose"]["run"]
    i = pose.index("--pose-target")
    assert pose[:i] + pose[i + 2:] == base and pose[i + 1] == "{pose_target}"
    texts = yaml.safe_load(FRAGMENT)["vars"]["ft_texts"]
    assert not {Path(t).stem for t in texts} & {"emma", "persuasion", "northangerabbey"}
    assert all((DATA_DIR / "english" / "austen" / Path(t).name).is_file() for t in texts)


def test_miniature_chain_merges_models_plain_transformers_reloads(tmp_path, capsys, one_thread):
    import torch
    from transformers import AutoModelForCausalLM

    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import spec

    path = experiment(tmp_path)
    spec.load(path)  # the full study's file is valid too, every arm and step
    out = tmp_path / "w"
    assert cli.main(["run", str(path), "--quick", "--out", str(out)]) == 0
    capsys.readouterr()
    assert not (out / "train" / "pi-x2-s0").exists()  # a step runs only for the arms that name it
    for name in ("yarn-x2-pose-s0",):
        run = json.loads((out / "train" / name / "run.json").read_text(encoding="utf-8"))
        merged = out / "train" / name / "merged"
        model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
        rope = model.config.rope_parameters
        assert rope["rope_type"] == "yarn" and rope["factor"] == 2 and rope["original_max_position_embeddings"] == 512
        with torch.no_grad():
            logits = model(input_ids=torch.arange(1, 200).unsqueeze(0)).logits
        assert math.isfinite(float(logits.abs().max()))
        tr = run["train"]
        assert (tr["steps"], tr["global_batch"], tr["lr"], tr["length"]["max"]) == (2, 1, 2e-4, 128)
        assert tr["rope"]["method"] == "yarn" and tr["rope"]["scale"] == 2
        # PoSE: 128-token samples whose ids reach past 127 (the sample length), within the x2 context
        assert 128 <= tr["coverage"]["longest"] < 1024 and tr["coverage"]["tokens_beyond"] == 0
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["status"] == "complete"
