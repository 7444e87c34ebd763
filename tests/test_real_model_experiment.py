"""experiments/real_model.yaml's --quick (2 windows of 512 tokens from Emma and Persuasion, keys at 256 / 512 x 25 /
75 %, the specs' original context 256, buckets of 128, seed 0, SmolLM2-135M) against plain transformers: the same
windows read by ``AutoModelForCausalLM`` with transformers' own rope type written into its config by hand
(``real_model_rope.theirs``: nothing of this repo's rope code), each key's retrieval and answer loss, every bucket's
loss past and within the window, each row's passkey cell (scipy's Wilson interval), the loss by bucket over windows
and the in-window cost over windows (scipy's t). Three rows cover every path of the probe: one forward a window
(none), a rope that follows the length, reading none's forward within the window and running its own at 2x
(dynamic_ntk: transformers' ``dynamic``), and one that runs its own forward at each length (longrope: its attention
factor is not plain RoPE's; transformers' ``longrope`` with the factor file's short and long factors). The other
eight rows run the same code (tests/test_experiments.py runs all eleven in --quick).

The experiment replaced scripts/real_model.py; its quick gave the script's cells to 1e-6 (answer losses: the probe's
float64 mean of the digits against the script's float32, < 1e-6 nats), the differences otherwise the runner's page
(docs/experiments.md)."""
from __future__ import annotations

import json
import re

import pytest
from real_model_rope import theirs

from ropescale.common.paths import REPO_ROOT

YAML = REPO_ROOT / "experiments" / "real_model.yaml"
QUICK = {"windows": 2, "lengths": (256, 512), "depths": (0.25, 0.75), "orig": 256, "bucket": 128, "seed": 0}
FACTORS = REPO_ROOT / "experiments" / "real_model" / "longrope_yarn2_smollm2_orig256.json"
TOL = 1e-4  # nats: this repo's rope against transformers' own (logits equal to 1e-4: tests/test_real_model_rope*.py)


def entries(arm: str) -> dict:
    """transformers' rope entries of an arm (its max_position_embeddings: the original context, 256)."""
    if arm == "none":
        return {"rope_type": "default"}
    if arm == "dynamic_ntk":
        return {"rope_type": "dynamic", "factor": 2.0}
    f = json.loads(FACTORS.read_text(encoding="utf-8"))
    return {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": QUICK["orig"],
            "short_factor": f["short_factor"], "long_factor": f["long_factor"]}


ARMS = ("none", "dynamic_ntk", "longrope")


def hf_read(model, ids):
    """(per-position next-token loss, argmax): position p the loss of token p given tokens < p."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    nll = torch.full((len(ids),), float("nan"), dtype=torch.float64)
    nll[1:] = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
    arg = torch.full((len(ids),), -1, dtype=torch.long)
    arg[1:] = logits[:-1].argmax(-1)
    return nll, arg


def bucket_means(w, nll, upto: int) -> dict:
    """{first position: mean loss over the novel's own tokens at positions 1..upto-1 in that bucket}."""
    b, out = QUICK["bucket"], {}
    for a in range(0, upto, b):
        v = [float(nll[p]) for p in range(max(a, 1), min(a + b, upto)) if w.hay[p]]
        if v:
            out[a] = sum(v) / len(v)
    return out


@pytest.fixture(scope="module")
def both(smollm2, tmp_path_factory):
    import torch
    from transformers import AutoTokenizer

    from ropescale.experiments import __main__ as cli
    from ropescale.probes import passkey as pk

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tmp = tmp_path_factory.mktemp("real_model_experiment")
        assert cli.main(["run", str(YAML), "--quick", "--only", ",".join(ARMS + ("none_control",)),
                         "--out", str(tmp / "e")]) == 0
        tok = AutoTokenizer.from_pretrained(str(smollm2))
        texts = pk.read_novels(["english/austen/emma.txt", "english/austen/persuasion.txt"])
        windows = pk.novel_windows(tok, texts, QUICK["windows"], QUICK["lengths"], QUICK["depths"], QUICK["seed"])
        ref = {}
        for arm in ARMS:
            for L in QUICK["lengths"]:  # a forward at each length (a reader of L tokens); a model a length, as
                # transformers' dynamic rope keeps the frequencies of the longest input it has read (it resets only
                # below the original context): a 256-token read after a 512-token one would not be plain RoPE
                model = theirs(smollm2, entries(arm), QUICK["orig"])
                for i, w in enumerate(windows):
                    ref.setdefault((arm, i), {})[L] = hf_read(model, w.ids[:L])
                del model
    finally:
        torch.set_num_threads(n)
    return {"work": tmp / "e", "windows": windows, "ref": ref, "tok": tok}


def jsonl(path):
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def reference_keys(both, arm):
    """{(window, length, depth): (name, distance, retrieved, answer loss)} read from transformers' forwards."""
    out = {}
    for i, w in enumerate(both["windows"]):
        for k in w.keys:
            nll, arg = both["ref"][(arm, i)][k.length]
            # the answer positions hold the key's own digits (the window plants what it says)
            assert both["tok"].decode([w.ids[p] for p in k.answer_pos]).replace(" ", "") == k.number
            ok = all(int(arg[p]) == w.ids[p] for p in k.answer_pos)
            out[(i, k.length, k.depth)] = (k.name, k.distance, ok, sum(float(nll[p]) for p in k.answer_pos)
                                           / len(k.answer_pos))
    return out


@pytest.mark.parametrize("arm", ARMS)
def test_keys_and_buckets_equal_transformers(both, arm):
    run = both["work"] / "runs" / arm / "s0"
    items = {(r["window"], r["col"], r["depth"]): r for r in jsonl(run / "items.jsonl")}
    want = reference_keys(both, arm)
    assert set(items) == set(want) and len(want) == 2 * 2 * 2  # 2 windows x 2 lengths x 2 depths
    for slot, (name, dist, ok, loss) in want.items():
        got = items[slot]
        assert (got["name"], got["distance"], got["retrieved"]) == (name, dist, ok), slot
        assert got["answer_loss"] == pytest.approx(loss, abs=TOL), slot
    longest, orig = max(QUICK["lengths"]), QUICK["orig"]
    for file, L, upto in (("buckets.jsonl", longest, longest), ("in_window.jsonl", orig, orig)):
        got = {(r["window"], r["bucket"]): r["loss"] for r in jsonl(run / file)}
        ref = {(i, a): x for i, w in enumerate(both["windows"])
               for a, x in bucket_means(w, both["ref"][(arm, i)][L][0], upto).items()}
        assert set(got) == set(ref) and ref, file
        for key, x in ref.items():
            assert got[key] == pytest.approx(x, abs=TOL), (file, key)


def test_cells_and_in_window_cost_equal_scipy_on_transformers(both):
    import scipy.stats

    res = json.loads((both["work"] / "results.json").read_text(encoding="utf-8"))["scores"]
    longest, orig = max(QUICK["lengths"]), QUICK["orig"]
    for arm in ARMS:
        keys = reference_keys(both, arm)
        for L in QUICK["lengths"]:
            flags = [ok for (i, length, d), (_, _, ok, _) in keys.items() if length == L]
            c = res["passkey"]["seeds"]["0"]["cells"][arm][f"L{L}"]
            assert c["n"] == len(flags) == 4 and c["mean"] == pytest.approx(100 * sum(flags) / len(flags))
            ci = scipy.stats.binomtest(sum(flags), len(flags)).proportion_ci(method="wilson")
            assert (c["lo"], c["hi"]) == pytest.approx((100 * ci.low, 100 * ci.high), abs=1e-6)
        per_window = [bucket_means(w, both["ref"][(arm, i)][longest][0], longest)
                      for i, w in enumerate(both["windows"])]
        for a in per_window[0]:  # the loss by bucket: the mean over windows
            c = res["loss"]["seeds"]["0"]["cells"][arm][f"pos {a}"]
            assert c["mean"] == pytest.approx(sum(b[a] for b in per_window) / 2, abs=TOL) and c["n"] == 2

    def in_window(arm, i):  # the in-window buckets' mean (positions >= 1 bucket: 128..255)
        b = bucket_means(both["windows"][i], both["ref"][(arm, i)][orig][0], orig)
        v = [x for a, x in b.items() if a >= QUICK["bucket"]]
        return sum(v) / len(v)

    cost = {f["a"]: f for f in res["in_window"]["seeds"]["0"]["families"]["in-window cost (row - none)"]}
    for arm in ARMS[1:]:
        d = [in_window(arm, i) - in_window("none", i) for i in range(2)]
        got = cost[arm]
        assert got["statistic"] == pytest.approx(sum(d) / 2, abs=TOL) and got["n"] == 2
        if max(abs(x) for x in d) < 1e-9:  # dynamic_ntk within the window is plain RoPE: none's forward
            assert arm == "dynamic_ntk" and got["p"] == 1.0
            continue
        t = scipy.stats.ttest_1samp(d, 0.0)
        ci = t.confidence_interval()
        assert (got["lo"], got["hi"]) == pytest.approx((ci.low, ci.high), abs=1e-3)
        assert got["p"] == pytest.approx(t.pvalue, abs=1e-3)


def test_no_key_control_equals_transformers_without_the_key(both, smollm2):
    """none_control: each key up to the quick's control_upto (256) read again by transformers with its sentence cut
    out of the window (the other keys stay), to its length; the keys past it carry no control; its cell and the
    family's with-the-key - without-it difference, paired by key, against the same numbers and scipy's t."""
    import scipy.stats
    import torch

    from ropescale.probes import passkey as pk

    run = both["work"] / "runs" / "none_control" / "s0"
    items = {(r["window"], r["col"], r["depth"]): r for r in jsonl(run / "items.jsonl")}
    model = theirs(smollm2, entries("none"), QUICK["orig"])
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    want = {}
    try:
        for i, w in enumerate(both["windows"]):
            for k in w.keys:
                got = items[(i, k.length, k.depth)]
                if k.length > 256:
                    assert "control_loss" not in got
                    continue
                sentence = pk.encode(both["tok"], pk.key_text(k.name, k.number))
                assert w.ids[k.key_pos:k.key_pos + len(sentence)] == sentence
                ids = w.ids[:k.key_pos] + w.ids[k.key_pos + len(sentence):k.length]
                nll = hf_read(model, ids)[0]
                loss = sum(float(nll[p - len(sentence)]) for p in k.answer_pos) / len(k.answer_pos)
                assert got["control_loss"] == pytest.approx(loss, abs=TOL)
                want[f"w{i}:L{k.length}:d{k.depth}"] = (got["answer_loss"], loss)
    finally:
        torch.set_num_threads(n)
    assert len(want) == 4
    res = json.loads((both["work"] / "results.json").read_text(encoding="utf-8"))["scores"]["control"]["seeds"]["0"]
    cells = res["cells"]
    assert set(cells["none_control"]) == {"L256"} and set(cells["none_keyed"]) == {"L256", "L512"}
    assert cells["none_control"]["L256"]["mean"] == pytest.approx(sum(b for _, b in want.values()) / 4, abs=TOL)
    fam = res["families"]["with the key - without it (the no-key control)"]
    got = [f for f in fam if f["a"] == "none_keyed"]
    assert len(got) == 1 and got[0]["n"] == 4
    d = [a - b for a, b in want.values()]
    assert got[0]["statistic"] == pytest.approx(sum(d) / 4, abs=TOL)
    ci = scipy.stats.ttest_1samp(d, 0.0).confidence_interval()
    assert (got[0]["lo"], got[0]["hi"]) == pytest.approx((ci.low, ci.high), abs=1e-3)


def test_forwards_are_shared_by_frequencies(both):
    """dynamic_ntk reads its forward at 256 (plain RoPE within the window) from none's and runs its own at 512;
    LongRoPE runs its own at both (its attention factor is not plain RoPE's); none one forward a window."""
    def forwards(arm):
        summary = json.loads((both["work"] / "runs" / arm / "s0" / "summary.json").read_text(encoding="utf-8"))
        return [w["forwards"] for w in summary["windows"].values()]

    assert forwards("dynamic_ntk") == [{"256": "read", "512": "ran"}] * 2
    assert forwards("longrope") == [{"256": "ran", "512": "ran"}] * 2
    assert forwards("none") == [{"512": "ran"}] * 2


def test_longrope_factor_files_are_yarn_x2s(smollm2):
    """The LongRoPE rows' factor files: YaRN x2's per-pair factors (transformers' yarn rule, found by
    :func:`rope_scaling.search.factors_of`) at 8,192 and at the quick's 256, short factors 1."""
    from rope_scaling import RopeSpec
    from rope_scaling.formulas import rescale_factors
    from rope_scaling.search import factors_of
    from rope_scaling.spec import read_longrope_factors

    exp_vars = __import__("yaml").safe_load(YAML.read_text(encoding="utf-8"))
    for orig, path in ((8192, exp_vars["vars"]["longrope_factors"]),
                       (256, exp_vars["quick"]["vars"]["longrope_factors"])):
        want = factors_of(rescale_factors(RopeSpec("yarn", 2.0, orig_ctx=orig), 64, 100000.0))
        got = read_longrope_factors(REPO_ROOT / path)
        assert got == want and set(got.short_factor) == {1.0}


@pytest.mark.parametrize("bad,what", [("within: [8192, 1024]", "within: [lo, hi]"),
                                      ("within: ['{nope}', 8192]", "within: [lo, hi]"),
                                      ("digits: 9", "digits: an integer 0-6")])
def test_within_and_digits_errors_name_the_file_and_line(tmp_path, bad, what):
    from ropescale.common.io import InputError
    from ropescale.experiments import spec

    text = YAML.read_text(encoding="utf-8")
    if bad.startswith("digits"):
        text = text.replace("    digits: 2\n", f"    {bad}\n", 1)
    else:
        text = text.replace('    within: ["{bucket}", "{orig}"]\n', f"    {bad}\n", 1)
    p = tmp_path / "x.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(what)) as e:
        spec.load(p)
    key = "    digits:" if bad.startswith("digits") else '  "in-window cost (row - none)":'
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith(key))
    assert str(e.value).startswith(f"{p}:{line}: ")


def test_quick_windows_are_the_files_novels():
    """The windows read here are the file's quick windows: its first two held-out novels, seed 0."""
    exp = __import__("yaml").safe_load(YAML.read_text(encoding="utf-8"))
    novels = exp["vars"]["novels"].split(",")
    q = exp["quick"]["vars"]
    assert novels[:2] == ["english/austen/emma.txt", "english/austen/persuasion.txt"]
    assert (q["windows"], q["lengths"], q["depths"], q["orig"], q["bucket"]) == (
        QUICK["windows"], ",".join(map(str, QUICK["lengths"])), ",".join(map(str, QUICK["depths"])), QUICK["orig"],
        QUICK["bucket"]) and exp["seeds"] == [QUICK["seed"]]
