"""experiments/real_model.yaml against scripts/real_model.py: the same quick plan (2 windows of 512 tokens from Emma
and Persuasion, keys at 256 / 512 x 25 / 75 %, the specs' original context 256, buckets of 128, seed 0, SmolLM2)
gives the same cells. The script reads its rows in one process (its ``read_row``, forwards shared across rows by
frequencies); the experiment runs one ``probes passkey`` a row, sharing forwards through ``--forwards``. Compared
here for three rows that cover every path (one forward a window: none; a rope that follows the length, reading
another row's forward within the window and running its own at 2x: dynamic_ntk; one that runs its own forward at
each length, the in-window buckets from the one at the original context: longrope): each key's window, name,
distance and retrieval, its answer loss, every bucket's loss and in-window loss (to 1e-6), each row's passkey count
and Wilson interval a length, the loss by bucket over windows, the in-window cost over windows (mean, t interval,
p: scipy's), and the bound and effective lengths (the script's ``summarize``). The other eight rows run the same
code (tests/test_experiments.py runs all eleven in --quick). The LongRoPE factor files equal the script's
``factors_of(rescale_factors(YaRN x2))`` at 8,192 and at the quick's 256.

Differences, and why:

- the answer loss a digit is the mean of the digits' losses in float64 (the probe's ``digit_record``), the script's
  torch's float32 mean: they differ by < 1e-6 nats;
- ``keys_in_context`` counts the key sentences before a key's answer (an early key of a longer length included);
  the script's table D names a copier of the keys of lengths <= L (3 / 6 / 9 at 4K / 8K / 16K);
- the page is the runner's: per score a table of cells (a proportion's Wilson interval, a mean's t interval over
  its units: the script's numbers), the families with p and BH q (new: the script tested nothing), beside each row
  the bound and the effective lengths by retrieval and by answer loss (run.json ``info``: the script's table A);
  not made by the runner: the effective length by loss (it needs the unscaled row's in-window loss, another run)
  and the answer loss by (length, depth) slot with its references (table D; each run's summary.json
  ``by_distance`` holds the reading by key distance with the uniform and copier references);
- each arm's cost is its run.json ``seconds`` (the script's results.jsonl: seconds and load average a row).
"""
from __future__ import annotations

import json
import math
import re
import sys

import pytest

from ropescale.common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import real_model as script

ROWS = {"none": "none", "dynamic_ntk": "dynamic_ntk", "longrope": "longrope (YaRN's factors)"}
YAML = REPO_ROOT / "experiments" / "real_model.yaml"


@pytest.fixture(scope="module")
def both(smollm2, tmp_path_factory):
    import torch
    from transformers import AutoTokenizer

    from ropescale.experiments import __main__ as cli

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tmp = tmp_path_factory.mktemp("real_model_experiment")
        assert cli.main(["run", str(YAML), "--quick", "--only", ",".join(ROWS), "--out", str(tmp / "e")]) == 0
        plan = script.QUICK
        specs = script.specs(plan, script._state(smollm2))
        recs = {}
        for i, w in enumerate(script.windows(plan, AutoTokenizer.from_pretrained(str(smollm2)))):
            cache: dict = {}
            for name in specs:  # the script's row order, so that its cache holds what its rows read
                if name in ROWS.values():
                    recs[(i, name)] = script.read_row(smollm2, name, specs[name], w, cache, plan)
    finally:
        torch.set_num_threads(n)
    return {"work": tmp / "e", "script": recs, "plan": plan}


def jsonl(path):
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


@pytest.mark.parametrize("arm", list(ROWS))
def test_keys_and_buckets_equal_the_script(both, arm):
    run = both["work"] / "runs" / arm / "s0"
    items = {(r["window"], r["col"], r["depth"]): r for r in jsonl(run / "items.jsonl")}
    keys = {(i, k["length"], k["depth"]): k for (i, name), r in both["script"].items() if name == ROWS[arm]
            for k in r["keys"]}
    assert set(items) == set(keys) and len(keys) == 2 * 2 * 2  # 2 windows x 2 lengths x 2 depths
    for slot, k in keys.items():
        got = items[slot]
        assert (got["name"], got["distance"], got["retrieved"]) == (k["name"], k["distance"], k["retrieved"]), slot
        assert got["answer_loss"] == pytest.approx(k["answer_loss"], abs=1e-6), slot
        assert got["answer_loss"] == pytest.approx(sum(got["digit_loss"]) / len(got["digit_loss"]), abs=1e-12)
    for file, field in (("buckets.jsonl", "buckets"), ("in_window.jsonl", "inwin_buckets")):
        got = {(r["window"], r["bucket"]): r["loss"] for r in jsonl(run / file)}
        want = {(i, b * both["plan"].bucket): x for (i, name), r in both["script"].items() if name == ROWS[arm]
                for b, x in enumerate(r[field]) if not math.isnan(x)}
        assert set(got) == set(want), file
        for key, x in want.items():
            assert got[key] == pytest.approx(x, abs=1e-6), (file, key)


def test_cells_and_in_window_cost_equal_the_script(both):
    import scipy.stats

    res = json.loads((both["work"] / "results.json").read_text(encoding="utf-8"))["scores"]
    plan, recs = both["plan"], both["script"]
    for arm, name in ROWS.items():
        for L in plan.lengths:
            flags = [k["retrieved"] for (i, n), r in recs.items() if n == name for k in r["keys"] if k["length"] == L]
            c = res["passkey"]["seeds"]["0"]["cells"][arm][f"L{L}"]
            assert c["n"] == len(flags) == 4 and c["mean"] == pytest.approx(100 * sum(flags) / len(flags))
            ci = scipy.stats.binomtest(sum(flags), len(flags)).proportion_ci(method="wilson")
            assert (c["lo"], c["hi"]) == pytest.approx((100 * ci.low, 100 * ci.high), abs=1e-6)
        for b in range(plan.total // plan.bucket):  # the loss by bucket: the mean over windows, t over windows
            x = [r["buckets"][b] for (i, n), r in recs.items() if n == name]
            c = res["loss"]["seeds"]["0"]["cells"][arm][f"pos {b * plan.bucket}"]
            assert c["mean"] == pytest.approx(sum(x) / len(x), abs=1e-6) and c["n"] == 2
    cost = {f["a"]: f for f in res["in_window"]["seeds"]["0"]["families"]["in-window cost (row - none)"]}
    for arm, name in ROWS.items():
        if arm == "none":
            continue
        d = [script.inwin(recs[(i, name)]) - script.inwin(recs[(i, "none")]) for i in range(2)]
        got = cost[arm]
        assert got["statistic"] == pytest.approx(sum(d) / 2, abs=1e-6) and got["n"] == 2
        if max(abs(x) for x in d) < 1e-9:  # dynamic_ntk within the window is plain RoPE: the same forward as none's
            assert got["p"] == 1.0
            continue
        t = scipy.stats.ttest_1samp(d, 0.0)
        ci = t.confidence_interval()
        assert (got["lo"], got["hi"]) == pytest.approx((ci.low, ci.high), abs=1e-5)
        assert got["p"] == pytest.approx(t.pvalue, abs=1e-6)


def test_forwards_are_shared_as_the_script_shares_them(both):
    """dynamic_ntk reads its forward at 256 (plain RoPE within the window) from none's, as the script's cache does,
    and runs its own at 512; LongRoPE runs its own at both (its attention factor is not plain RoPE's)."""
    def forwards(arm):
        summary = json.loads((both["work"] / "runs" / arm / "s0" / "summary.json").read_text(encoding="utf-8"))
        return [w["forwards"] for w in summary["windows"].values()]

    assert forwards("dynamic_ntk") == [{"256": "read", "512": "ran"}] * 2
    assert [sorted(r["forwards"][256]) + sorted(r["forwards"][512]) for (i, n), r in both["script"].items()
            if n == "dynamic_ntk"] == [["reused", "seconds"]] * 2
    assert forwards("longrope") == [{"256": "ran", "512": "ran"}] * 2
    assert forwards("none") == [{"512": "ran"}] * 2


def test_bound_and_effective_lengths_equal_the_scripts(both, smollm2):
    by_row = {}
    for (i, name), r in both["script"].items():
        by_row.setdefault(name, []).append({"window": i, "seconds": 0.0, **r})
    want = {r["row"]: r for r in script.summarize(by_row, both["plan"], smollm2)}
    for arm, name in ROWS.items():
        info = json.loads((both["work"] / "runs" / arm / "s0" / "run.json").read_text())["info"]
        assert info["bound"] == (None if want[name]["bound"] is None else round(want[name]["bound"])), arm
        assert (info["eff_passkey"], info["eff_answer"]) == (want[name]["eff_passkey"], want[name]["eff_answer"])


@pytest.mark.parametrize("orig,path", [(8192, "ropescale/probes/ruler/longrope_yarn2_smollm2.json"),
                                       (256, "experiments/real_model/longrope_yarn2_smollm2_orig256.json")])
def test_longrope_factor_files_are_the_scripts(smollm2, orig, path):
    from rope_scaling import RopeSpec
    from rope_scaling.formulas import rescale_factors
    from rope_scaling.search import factors_of
    from rope_scaling.spec import read_longrope_factors

    st = script._state(smollm2)
    want = factors_of(rescale_factors(RopeSpec("yarn", 2.0, orig_ctx=orig), st.rotary_dim, st.base))
    assert read_longrope_factors(REPO_ROOT / path) == want
    exp_vars = __import__("yaml").safe_load(YAML.read_text(encoding="utf-8"))
    named = exp_vars["quick"]["vars"]["longrope_factors"] if orig == 256 else exp_vars["vars"]["longrope_factors"]
    assert named == path


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
