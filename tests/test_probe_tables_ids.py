"""experiments/probe_tables.yaml pairs an item with itself across lengths by one record field (suffix-id: the
prefix's end ``boundary``; ppl: the target's ``target_start``), which holds only while no two items of one run share
it: checked here for every seed, item count and length list the file runs (the study and its miniature), by
drawing the items as the probes draw them (``suffix_id.sentence_examples``, ``targets.sample_targets``: no model)
and comparing the field's values with the items' full keys (``BOOK@OFFSET``, what the probes' ids start with)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "experiments" / "probe_tables.yaml"


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} once in {argv}"
    return argv[argv.index(name) + 1]


def draws(quick: bool) -> dict:
    """{(probe, seed, n, longest length): the score's id field} of every arm the file (or its miniature) runs."""
    from ropescale.experiments import spec
    from ropescale.experiments.runner import values

    exp = spec.load(FILE, quick=quick)
    out = {}
    for a, arm in exp.arms.items():
        (score,) = arm.scores
        for s in exp.seeds:
            argv = spec.fill(arm.run, values(exp, Path("/work"), s, None), a)
            probe = argv[1]
            assert (probe == "suffix-id") == score.startswith("sid"), a
            longest = max(int(x) for x in flag(argv, "--lengths").split(","))
            out[probe, int(flag(argv, "--seed")), int(flag(argv, "--n")), longest] = exp.scores[score].id
    return out


@pytest.fixture(scope="module")
def text():
    from transformers import AutoTokenizer

    from ropescale.common.models import resolve_model
    from ropescale.probes.data import load_docs, tiny_heldout_file

    return AutoTokenizer.from_pretrained(str(resolve_model("tiny"))), load_docs(str(tiny_heldout_file("tiny")))


@pytest.mark.parametrize("quick", [False, True], ids=["study", "quick"])
def test_the_id_field_names_one_item_a_run(quick, text):
    from ropescale.probes.suffix_id import sentence_examples
    from ropescale.probes.targets import DEFAULT_TARGET_LEN, sample_targets, tokenize_docs

    tok, docs = text
    doc_ids = None
    got = draws(quick)
    assert {p for p, *_ in got} == {"suffix-id", "ppl"}
    for (probe, seed, n, longest), field in got.items():
        if probe == "suffix-id":
            assert field == "boundary"
            items = sentence_examples(docs, tok, n=n, max_len=longest - 128, suffix_len=128, seed=seed)
            keys = [f"{e['book']}@{e['boundary']}" for e in items]
            values = [e["boundary"] for e in items]
        else:
            assert field == "target_start"
            doc_ids = doc_ids or tokenize_docs(tok, docs)
            items = sample_targets(doc_ids, docs, n, longest - DEFAULT_TARGET_LEN, DEFAULT_TARGET_LEN, seed)
            keys = [t.key for t in items]
            values = [t.start for t in items]
        assert len(items) == n and len(set(keys)) == n, (probe, seed)
        assert len(set(values)) == n, f"{probe} seed {seed}: two items share their {field}: {sorted(values)}"
