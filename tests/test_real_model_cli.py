"""SmolLM2-135M (``make real-model``) through the user-facing commands the tiny default runs through:
``eval_summ.py generate`` (YaRN x2 at load time) and ``ropescale probes ppl``, each on a short English input. The
code path, not a measurement; what each writes is checked against plain transformers where it is a number."""
from __future__ import annotations

import json
import math

import pytest
import torch

from ropescale.common.paths import DATA_DIR

AUSTEN = DATA_DIR / "english" / "austen" / "prideprejudice.txt"


def test_generate_with_a_rope_method_on_the_real_model(smollm2, tmp_path):
    from ropescale.evaluation.cli import main

    text = AUSTEN.read_text(encoding="utf-8")[5000:6500]
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"id": "pp", "context": text, "summary": "A summary.", "subset": "L"}) + "\n",
                    encoding="utf-8")
    out = tmp_path / "gen"
    assert main(["generate", "--model", str(smollm2), "--data", str(data), "--prompt", "ie", "--rope", "yarn",
                 "--scale", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["rope"]["method"] == "yarn" and run["rope"]["scale"] == 2
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(preds) == 1 and preds[0]["id"] == "pp" and preds[0]["prediction"].strip()


def test_the_ppl_probe_on_the_real_model_matches_plain_transformers(smollm2, tmp_path, capsys):
    """The probe's cell (mean loss of the last 10 tokens of a 256-token input) equals plain transformers' loss on
    the same tokens of the unscaled model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ropescale.probes.cli import main

    book = tmp_path / "excerpt.txt"  # a plain .txt file is one document
    book.write_text(AUSTEN.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    out = tmp_path / "ppl"
    assert main(["ppl", "--model", str(smollm2), "--data", str(book), "--n", "1", "--lengths", "256",
                 "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (cell,) = summary["cells"]
    assert cell["col"] == 256 and cell["n"] == 1 and math.isfinite(cell["value"])
    (item,) = [json.loads(line) for line in (out / "items.jsonl").read_text(encoding="utf-8").splitlines()]
    assert item["prefix_len"] + item["target_len"] == 256 and item["target_len"] == 10
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    doc = tok(book.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    s = item["target_start"]
    ids = doc[s - item["prefix_len"]:s + item["target_len"]]
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    assert cell["value"] == pytest.approx(nll[-10:].mean().item(), abs=1e-4)
