"""experiments/search.yaml's claims about its windows, for every seed it runs (the file's and its miniature's): the
held-out windows (each arm's ``probes ppl``) are drawn with seed 10000 + the seed (the convention of the study's
first measurement), none overlaps a window the search scored on (``rope search``'s fitness windows: the probes'
target draw with the window seed), and no window is drawn twice; every arm reads the same windows (the same draw
flags), so each pair of arms compares the same windows. The draws are recomputed here from the filled-in flags."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "experiments" / "search.yaml"


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} once in {argv}"
    return argv[argv.index(name) + 1]


def filled(quick: bool):
    """(experiment, {seed: (the search's filled-in flags, {arm: its filled-in flags})})."""
    from ropescale.experiments import spec
    from ropescale.experiments.runner import lengths_of, values

    exp = spec.load(FILE, quick=quick)
    out = {}
    for s in exp.seeds:
        (t,) = {t for a in exp.arms for t in lengths_of(exp, a)}
        v = values(exp, Path("/work"), s, t)
        search = spec.fill(exp.prepare["search"][1], dict(v, out=v["search"]), "search")
        arms = {a: spec.fill(arm.run, v, a) for a, arm in exp.arms.items()}
        out[s] = (search, arms)
    return exp, out


@pytest.fixture(scope="module")
def text():
    from transformers import AutoTokenizer

    from ropescale.common.models import resolve_model
    from ropescale.probes.data import load_docs, tiny_heldout_file
    from ropescale.probes.targets import tokenize_docs

    tok = AutoTokenizer.from_pretrained(str(resolve_model("tiny")))
    docs = load_docs(str(tiny_heldout_file("tiny")))
    return tok, docs, tokenize_docs(tok, docs)


@pytest.mark.parametrize("quick", [False, True], ids=["study", "quick"])
def test_heldout_windows_are_none_the_search_saw(quick, text):
    from ropescale.probes.rope_search import draw_windows
    from ropescale.probes.targets import sample_targets

    tok, docs, doc_ids = text
    exp, seeds = filled(quick)
    assert len(seeds) == len(exp.seeds) >= 1
    for s, (search, arms) in seeds.items():
        assert search[:2] == ["rope", "search"] and int(flag(search, "--window-seed")) == s
        target, k = int(flag(search, "--target-len")), int(flag(search, "--score-tokens"))
        fitness = draw_windows(tok, docs, int(flag(search, "--windows")), target, k, s)
        draws = set()
        for a, argv in arms.items():
            assert argv[:2] == ["probes", "ppl"], a
            draws.add(tuple(flag(argv, f) for f in ("--lengths", "--target-len", "--n", "--seed")))
        assert len(draws) == 1, f"seed {s}: every arm reads the same windows, not {draws}"
        ((length, scored, n, held_seed),) = draws
        assert (int(length), int(scored)) == (target, k)  # the search's own measure
        assert int(held_seed) == 10_000 + s
        held = sample_targets(doc_ids, docs, int(n), target - k, k, int(held_seed))
        spans = [(docs[t.doc].id, t.start - (target - k)) for t in held]
        assert len(set(spans)) == len(spans), f"seed {s}: a window drawn twice"
        for doc, start in spans:
            for w in fitness:
                assert not (doc == w.doc and start < w.start + target and w.start < start + target), (
                    f"seed {s}: held-out window {doc}@{start} overlaps the search's {w.doc}@{w.start}")


def test_the_sweep_is_yarn_at_each_attention_factor():
    """The sweep's arms: YaRN x8 with --yarn-mscale A, A the factor its label names, and one family compares each
    with YaRN at its own factor (0.1 ln 8 + 1)."""
    import math

    exp, seeds = filled(False)
    _, arms = next(iter(seeds.values()))
    sweep = {a: float(flag(argv, "--yarn-mscale")) for a, argv in arms.items() if "--yarn-mscale" in argv}
    assert len(sweep) >= 5
    for a, m in sweep.items():
        assert flag(arms[a], "--rope") == "yarn" and float(flag(arms[a], "--scale")) == 8
        assert float(exp.arms[a].label.rsplit("attention factor ", 1)[1]) == m
        assert abs(m - (0.1 * math.log(8) + 1)) > 1e-3  # never YaRN's own factor: that is the reference row
    fam = next(f for f in exp.families.values() if all(b == "yarn" for _, b in f.pairs) and
               {a for a, _ in f.pairs} == set(sweep))
    assert "--yarn-mscale" not in arms["yarn"] and len(fam.pairs) == len(sweep)
