"""experiments/positions.yaml holds the study docs/positions.md reads: every policy as a fine-tune on its data (the
flags written out here, as the study defined them), both F.2 prompts a row, the 15 comparisons as one family, and
a quick miniature that trains each policy's data. The miniature itself runs in tests/test_experiments.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

FILE = Path(__file__).resolve().parent.parent / "experiments" / "positions.yaml"

# pool -> (the packed set it trains on, the policy's finetune flags); None: no fine-tune (YaRN x8 at load time)
POLICIES = {
    "training-free": None,
    "packed": ("packed_long", []),
    "reset-document": ("packed_long", ["--positions", "reset", "--attention", "document"]),
    "packed-short": ("packed_multi", []),
    "unique-marks": ("packed_unique", []),
    "reset-document-short": ("packed_multi", ["--positions", "reset", "--attention", "document"]),
    "pose": ("packed_one", ["--pose-target", "{pose_target}"]),
    "pose-matched": ("packed_one", ["--pose-target", "{pose_target}", "--global-batch", "16"]),
    "reset-document-pose": ("packed_multi", ["--positions", "reset", "--attention", "document", "--pose-target",
                                             "{pose_target}"]),
}
COMPARE = [
    ("packed-short", "training-free"), ("packed", "training-free"), ("reset-document-short", "training-free"),
    ("pose", "training-free"), ("packed-short", "reset-document-short"), ("unique-marks", "packed-short"),
    ("unique-marks", "reset-document-short"), ("reset-document-short", "packed"), ("pose", "packed-short"),
    ("pose", "reset-document-short"), ("pose", "packed"), ("pose-matched", "pose"),
    ("pose-matched", "reset-document-short"), ("reset-document-pose", "reset-document-short"),
    ("reset-document-pose", "pose-matched"),
]
POLICY_FLAGS = ("--positions", "--attention", "--pose-target", "--pose-chunks", "--global-batch")


@pytest.fixture(scope="module")
def study():
    return yaml.safe_load(FILE.read_text(encoding="utf-8"))


def flag_pairs(run: list) -> list:
    """The (flag, value) pairs of a flag list that set a packing policy or the batch."""
    return [(str(f), str(run[i + 1])) for i, f in enumerate(run) if f in POLICY_FLAGS]


def test_every_policy_fine_tunes_its_data_with_its_flags(study):
    prep, arms, pools = study["prepare"], study["arms"], study["pools"]
    assert set(pools) == set(POLICIES) and study["table"] == list(POLICIES)
    for pool, policy in POLICIES.items():
        members = pools[pool]["arms"]
        runs = [arms[a]["run"] for a in members]
        assert [r[r.index("--prompt") + 1] for r in runs] == ["ft-ie", "ft-ib"]
        models = {r[r.index("--model") + 1] for r in runs}
        assert len(models) == 1
        model = models.pop()
        if policy is None:
            assert model == "tiny" and all(r[r.index("--rope") + 1] == "{rope}" for r in runs)
            continue
        merged = prep[model.strip("{}")]["run"]
        assert merged[:2] == ["finetune", "merge"]
        ft = prep[merged[merged.index("--run") + 1].strip("{}")]["run"]
        data, flags = policy
        assert ft[0] == "finetune" and ft[ft.index("--data") + 1] == "{" + data + "}"
        assert ft[ft.index("--rope") + 1] == "{rope}" and ft[ft.index("--scale") + 1] == "{scale}"
        assert flag_pairs(ft) == flag_pairs(flags), pool
        assert ft[-1] == "{finetune_args}"  # the quick run's flags come last: they win over the policy's batch


def test_the_data_each_policy_reads(study):
    prep, v = study["prepare"], study["vars"]
    assert prep["packed_unique"]["run"][:4] == ["data", "unique-marks", "--data", "{packed_multi}"]
    for name, pairs, lo, hi in (("packed_long", "pairs_long", "pack_min", "pack_max"),
                                ("packed_multi", "pairs_short", "pack_min", "pack_max"),
                                ("packed_one", "pairs_short", "one_min", "one_max")):
        run = prep[name]["run"]
        assert run[:2] == ["data", "pack"] and run[run.index("--pairs") + 1] == "{" + pairs + "}"
        assert (run[run.index("--min-tokens") + 1], run[run.index("--max-tokens") + 1]) == ("{%s}" % lo, "{%s}" % hi)
    assert (v["pack_min"], v["pack_max"], v["one_min"], v["one_max"], v["pose_target"]) == (1024, 2048, 256, 512, 4096)


def test_pair_contexts_fit_their_samples():
    """The recall pairs' context ranges are what ropescale.common.recall.pair_range gives for the samples' token
    ranges on the tiny default's tokenizer (the full study's and the miniature's)."""
    from data_concat.tokenizer import load_tokenizer
    from ropescale.common.recall import pair_range

    full = yaml.safe_load(FILE.read_text(encoding="utf-8"))
    v, q = full["vars"], full["quick"]["vars"]
    tok = load_tokenizer("tiny")
    assert pair_range(tok, v["pack_min"], v["pack_max"]) == (v["long_min"], v["long_max"])
    assert pair_range(tok, v["one_min"], v["one_max"]) == (v["short_min"], v["short_max"])
    assert pair_range(tok, q["pack_min"], q["pack_max"]) == (q["long_min"], q["long_max"])


def test_the_comparisons_are_one_family_of_fifteen(study):
    fams = study["families"]
    assert list(fams) == ["policies"]
    got = fams["policies"]
    pairs = [tuple(p) for p in (got["pairs"] if isinstance(got, dict) else got)]
    assert pairs == COMPARE and len(study["lengths"]) == 4  # 60 tests: the family's BH q
