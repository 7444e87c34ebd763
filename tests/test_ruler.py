"""The ruler probe (issue 50): each generator against hand-worked checks, the scorers against RULER's own
definitions written out here, the scoring paths against transformers' forward and generate, and a quick run of
``probes ruler`` on the tiny default."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.paths import DATA_DIR
from ropescale.probes.ruler import score as sc
from ropescale.probes.ruler.base import make_context
from ropescale.probes.ruler.tasks import TASKS, make_sample
from ropescale.probes.ruler.templates import NOISE


# RULER, scripts/eval/synthetic/constants.py, written out (the reference the scorers must match)
def ruler_string_match_part(preds, refs):
    score = sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)]) \
        / len(preds) * 100
    return round(score, 2)


def ruler_string_match_all(preds, refs):
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)
                 for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


@pytest.fixture(scope="module")
def en(qwen2_tokenizer):
    text = (DATA_DIR / "english" / "austen" / "emma.txt").read_text(encoding="utf-8")[:300_000]
    return make_context(qwen2_tokenizer, "en", [text])


@pytest.fixture(scope="module")
def zh():
    from transformers import AutoTokenizer

    from ropescale.common.models import ASSET_DIR
    from ropescale.common.paths import CHAPTERS_JSONL

    tok = AutoTokenizer.from_pretrained(str(ASSET_DIR))
    text = CHAPTERS_JSONL.read_text(encoding="utf-8")[:200_000]
    return make_context(tok, "zh", [text])


def test_scorers_match_rulers_definitions():
    cases = [(["The number is 123 and 456.", "abc"], [["123", "456"], ["ABC"]]),  # case-insensitive
             (["only 123 here", "nothing"], [["123", "456", "789"], ["x1"]]),
             (["", "ZZZ"], [["a"], ["zz"]])]
    hand_all = [100.0, round((1 / 3 + 0) / 2 * 100, 2), 50.0]  # worked by hand
    hand_part = [100.0, 50.0, 50.0]
    for (p, r), a, b in zip(cases, hand_all, hand_part):
        assert sc.string_match_all(p, r) == ruler_string_match_all(p, r) == a
        assert sc.string_match_part(p, r) == ruler_string_match_part(p, r) == b
    assert sc.postprocess("  12\x0334\t ") == "12\n34"  # RULER's postprocess_pred: control chars -> \n, stripped


def _context_lines(sample):
    """The noise haystack's lines (RULER joins its sentences with newlines) between the template's head and tail."""
    return [ln for ln in sample.text.split("\n") if ln == NOISE["en"] or "special magic number for" in ln
            and ln.startswith("One of")]


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_niah_single_needle_at_its_depth_and_once(en, depth):
    for L in (512, 1024):
        s = make_sample(en, "niah_grid", L, 0, 0, depth)
        assert s.total <= L, (s.total, L)
        unit = len(en.encode("\n" + NOISE["en"]))
        assert s.total > L - unit - 2  # the haystack is the largest that fits: one more sentence would not
        lines = _context_lines(s)
        k = len(lines) - 1  # haystack sentences
        at = next(i for i, ln in enumerate(lines) if ln.startswith("One of"))
        assert abs(at - depth * k) <= 1, (at, depth, k)  # the needle at the stated depth, +-1 sentence
        (value,) = s.refs
        assert re.fullmatch(r"\d{7}", value) and s.text.count(value) == 1  # the answer in the input exactly once
        assert en.tokenizer.decode(s.answer[slice(*s.spans[0])]) == value
        assert s.text.endswith("mentioned in the provided text is")  # RULER's singular answer prefix


def test_niah_multikey_distractors_distinct(en):
    s = make_sample(en, "niah_multikey_1", 1024, 3, 0)
    needles = re.findall(r"One of the special magic numbers? for (\S+) is: (\d+)\.", s.text)
    assert len(needles) == 4
    keys = [k for k, _ in needles]
    values = [v for _, v in needles]
    assert len(set(keys)) == 4 and len(set(values)) == 4  # distinct distractors
    asked = s.info["asked"]
    assert len(asked) == 1 and asked[0] in keys
    assert s.refs == [values[keys.index(asked[0])]]
    assert all(s.text.count(v) == 1 for v in values)
    assert s.total <= 1024


def test_niah_multivalue_and_multiquery(en):
    mv = make_sample(en, "niah_multivalue", 1024, 0, 0)
    assert len(mv.refs) == 4 and len(set(mv.refs)) == 4
    assert all(mv.text.count(v) == 1 for v in mv.refs)
    assert [en.tokenizer.decode(mv.answer[a:b]) for a, b in mv.spans] == mv.refs
    mq = make_sample(en, "niah_multiquery", 1024, 0, 0)
    assert len(mq.info["asked"]) == 4 and len(mq.refs) == 4
    q = mq.text.rsplit("\n", 1)[-1]
    assert all(k in q for k in mq.info["asked"])  # every key asked for in the question
    assert ", and " in q  # RULER's "a, b, c, and d"


def test_niah_novel_haystack_is_the_novel(en):
    s = make_sample(en, "niah_single_2", 1024, 1, 0)
    assert NOISE["en"] not in s.text
    assert sum(sent in s.text for sent in en.novel[:20000]) > 10  # sentences of Emma
    assert s.total <= 1024


def test_vt_chain_in_order(en):
    s = make_sample(en, "vt", 1024, 0, 0)
    vs = s.refs
    assert len(vs) == 5 and len(set(vs)) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in vs)
    value = s.info["value"]
    first = s.text.index(f"VAR {vs[0]} = {value}")
    pos = [first] + [s.text.index(f"VAR {vs[j + 1]} = VAR {vs[j]}") for j in range(4)]
    assert pos == sorted(pos)  # the chain's statements in order
    assert f"assigned the value {value}" in s.text and s.total <= 1024


@pytest.mark.parametrize("L,freq", [(1024, (6, 1)), (4096, (30, 3))])
def test_cwe_counts(en, L, freq):
    s = make_sample(en, "cwe", L, 0, 0)
    assert (s.info["freq_cw"], s.info["freq_ucw"]) == freq  # RULER's counts below / from 4,096
    ctx = s.text.split("\n")[1]
    words = re.findall(r"\d+\. (\S+)", ctx)
    assert len(words) == s.info["entries"]
    counts = {w: words.count(w) for w in set(words)}
    assert len(s.refs) == 10 and len(set(s.refs)) == 10
    assert all(counts[w] == freq[0] for w in s.refs)
    assert all(c == freq[1] for w, c in counts.items() if w not in s.refs)
    assert s.total <= L
    # each word's teacher-forced span is that word's own tokens (Qwen2 writes "1. shout" as '1', '.', ' shout')
    assert [en.tokenizer.decode(s.answer[a:b]).strip() for a, b in s.spans] == s.refs


def test_cwe_lowers_its_count_where_none_fit(zh):
    s = make_sample(zh, "cwe", 512, 0, 0)
    assert s.total <= 512 and 2 <= s.info["freq_cw"] <= 6
    assert [zh.tokenizer.decode(s.answer[a:b]).strip() for a, b in s.spans] == s.refs


def test_fwe_zipf_counts(en):
    s = make_sample(en, "fwe", 2048, 0, 0)
    words = s.text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split(" ")
    n = s.info["num_words"]
    z2 = math.pi ** 2 / 6  # zeta(2)
    for r, w in enumerate(s.refs, start=2):
        assert words.count(w) == int(n * r ** -2 / z2)  # RULER's int(num_words k^-alpha / zeta(alpha))
    assert words.count("...") == int(n / z2)
    others = [words.count(w) for w in set(words) if w not in s.refs and w != "..."]
    assert max(others) <= min(words.count(w) for w in s.refs)
    assert s.total <= 2048


def test_chinese_templates_fit_the_tiny_tokenizer(zh):
    for task in TASKS:
        s = make_sample(zh, task, 512, 0, 0)
        assert s.total <= 512, task
        assert all(len(zh.encode(w)) == 1 for w in zh.words[:50])  # words of the vocabulary: one token each
    g = make_sample(zh, "niah_grid", 512, 0, 0, 0.5)
    assert g.text.count(g.refs[0]) == 1 and "特别的神奇数字是：" in g.text


def test_too_short_length_is_one_line(en):
    with pytest.raises(InputError, match="too short for task niah_single_1"):
        make_sample(en, "niah_single_1", 100, 0, 0)


def test_teacher_forced_and_generated_against_transformers(make_tiny_model, tiny_tokenizer, one_thread):
    import torch

    from ropescale.probes.ruler.base import Sample
    from ropescale.probes.scorer import score_continuations

    model, _ = make_tiny_model(orig_ctx=64, save=False)
    model.eval()
    ids = tiny_tokenizer("草是绿的。天是蓝的。太阳是黄的。" * 4, add_special_tokens=False)["input_ids"]
    prompt, answer = ids[:40], ids[40:46]
    s = Sample("t", 64, 0, prompt, answer, [(0, 3), (3, 6)], ["\x00never", "\x00never"], 10)
    shared = sc.read_sample(model, s, tiny_tokenizer, shared=True, eos_id=None)
    full = sc.read_sample(model, s, tiny_tokenizer, shared=False, eos_id=None)
    ref = score_continuations(model, [prompt], [answer])[0]  # the project's batched scorer, one full forward
    assert shared["answer_logprob"] == pytest.approx(ref.logprob, abs=1e-4)
    assert full["answer_logprob"] == pytest.approx(ref.logprob, abs=1e-4)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + answer])).logits[0]
    arg = logits[len(prompt) - 1:-1].argmax(-1).tolist()
    read = [arg[a:b] == answer[a:b] for a, b in s.spans]
    assert shared["tf_read"] == read and shared["tf_all"] == sum(read) / 2
    with torch.no_grad():  # transformers' greedy generate: the same tokens (refs never found: the whole budget)
        g = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    assert shared["generated"] == full["generated"] == 10
    assert shared["pred"] == full["pred"] == sc.postprocess(tiny_tokenizer.decode(g, skip_special_tokens=True))


def test_average_and_effective_length_by_hand():
    from ropescale.probes.ruler.tables import averages, effective

    recs = []
    for task, scores in {"a": {512: [1, 1], 1024: [1, 0]}, "b": {512: [1, 0], 1024: [0, 0]}}.items():
        for L, vals in scores.items():
            recs += [{"task": task, "way": "gen", "col": L, "value": v} for v in vals]
    avg = averages(recs)["gen"]
    assert avg[512][0] == pytest.approx(75.0) and avg[1024][0] == pytest.approx(25.0)  # mean of the task means
    e = effective(avg, 512)
    assert e["in_window_score"] == pytest.approx(75.0)
    assert e["absolute"]["text"] == "<512"  # 75 < 85.6
    assert e["relative"]["threshold"] == pytest.approx(0.85 * 75) and e["relative"]["text"] == "512"  # 25 < 63.75


def test_probes_ruler_on_the_tiny_default(tmp_path, capsys, one_thread):
    from ropescale.probes.cli import main
    from ropescale.probes.ruler.tables import main as tables

    out = tmp_path / "run"
    rc = main(["ruler", "--model", "tiny", "--rope", "yarn", "--scale", "8", "--lengths", "512", "--n", "1",
               "--tasks", "niah_single_1,vt,niah_grid", "--depths", "2", "--max-new-tokens", "4", "--threads", "1",
               "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} >= {"run.json", "items.jsonl", "summary.json"}
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert len(items) == 2 * (2 + 2)  # (2 tasks + 2 depths) x (tf, gen)
    assert all(r["tokens"] <= 512 and 0 <= r["value"] <= 1 for r in items)
    for task in ("niah_single_1", "vt", "niah_grid", "average"):  # the experiment's score files, with run.json
        rows = [json.loads(x) for x in (out / f"ruler-{task}.jsonl").read_text().splitlines()]
        assert len(rows) == {"average": 2, "niah_grid": 2}.get(task, 1) and all(r["length"] == 512 for r in rows)
    vt = {r["way"]: r["value"] for r in items if r["task"] == "vt"}
    row = json.loads((out / "ruler-vt.jsonl").read_text())
    assert (row["gen"], row["tf"]) == (pytest.approx(100 * vt["gen"]), pytest.approx(100 * vt["tf"]))
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["average"]) == {"tf", "gen"} and summary["effective"]["gen"]["absolute"]["threshold"] == 85.6
    assert len(summary["grid"]["gen"]) == 2
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "ruler" in capsys.readouterr().out
    assert tables([str(out), "--out", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page.md").read_text()
    assert "**average**" in page and "Needle grid" in page and Path(tmp_path / "page-gen.png").stat().st_size > 1000


def test_average_interval_t_below_8_and_none_for_one():
    from scipy import stats

    from ropescale.probes.ruler.tables import averages

    recs = [{"task": t, "way": "gen", "col": 512, "value": v}
            for t, vals in {"a": [1, 0.5, 0.75], "b": [0, 0.25, 0]}.items() for v in vals]
    mean, lo, hi, tasks = averages(recs)["gen"][512]
    a, b = [100, 50, 75], [0, 25, 0]
    se = math.sqrt(stats.tvar(a) / 3 + stats.tvar(b) / 3) / 2  # the variance of a mean of two task means
    half = stats.t.ppf(0.975, 2) * se
    assert mean == pytest.approx((75 + 25 / 3) / 2)
    assert (lo, hi) == (pytest.approx(max(0.0, mean - half)), pytest.approx(min(100.0, mean + half)))
    one = averages([{"task": "a", "way": "tf", "col": 512, "value": 0.5}])["tf"][512]
    assert one[1] is None and one[2] is None  # n = 1: no interval


def test_score_files_by_hand(tmp_path):
    from ropescale.probes.ruler.score_files import file_name, write_score_files

    def item(task, L, i, way, value, depth=None, loss=None):
        return {"task": task, "col": L, "index": i, "depth": depth, "way": way, "value": value,
                **({"ref_loss": loss} if way == "tf" else {})}

    recs = [item("vt", 512, 0, "tf", 0.4, loss=2.0), item("vt", 512, 0, "gen", 1.0),
            item("vt", 512, 1, "tf", 0.0, loss=3.0), item("vt", 512, 1, "gen", 0.2),
            item("niah_single_1", 512, 0, "tf", 1.0, loss=0.5), item("niah_single_1", 512, 0, "gen", 1.0),
            item("niah_single_1", 512, 1, "tf", 0.0, loss=4.0), item("niah_single_1", 512, 1, "gen", 0.0),
            item("niah_grid", 512, 0, "gen", 1.0, depth=0.5), item("niah_grid", 512, 0, "tf", 0.0, depth=0.5, loss=1)]
    write_score_files(tmp_path, recs)
    read = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in tmp_path.iterdir()}
    assert set(read) == {file_name(t) for t in ("vt", "niah_single_1", "niah_grid", "average")}
    assert read["ruler-vt.jsonl"] == [
        {"sample": "0", "length": 512, "tf": 40.0, "tf_hit": 0, "ref_loss": 2.0, "gen": 100.0, "gen_hit": 1},
        {"sample": "1", "length": 512, "tf": 0.0, "tf_hit": 0, "ref_loss": 3.0, "gen": 20.0, "gen_hit": 0}]
    assert read["ruler-niah_grid.jsonl"] == [
        {"sample": "d500:0", "length": 512, "gen": 100.0, "gen_hit": 1, "tf": 0.0, "tf_hit": 0, "ref_loss": 1.0}]
    avg = read["ruler-average.jsonl"]  # the grid is not a task of the average
    assert sorted(r["sample"] for r in avg) == ["niah_single_1:0", "niah_single_1:1", "vt:0", "vt:1"]
    by = {r["sample"]: r for r in avg}  # each sample's hits and reference loss ride along (a pooled needle loss)
    assert (by["vt:0"]["gen_hit"], by["vt:0"]["tf_hit"], by["vt:0"]["ref_loss"]) == (1, 0, 2.0)
    assert (by["niah_single_1:1"]["gen_hit"], by["niah_single_1:1"]["ref_loss"]) == (0, 4.0)
    # RULER's average: the mean over the tasks of each task's mean (equal n): gen (50 + 60) / 2, tf (50 + 20) / 2
    assert sum(r["gen"] for r in avg) / len(avg) == pytest.approx(((100 + 0) / 2 + (100 + 20) / 2) / 2)
    assert sum(r["tf"] for r in avg) / len(avg) == pytest.approx(((100 + 0) / 2 + (40 + 0) / 2) / 2)


def test_ruler_experiment_every_method_kinds_and_families():
    from rope_scaling.formulas import REGISTRY
    from ropescale.experiments import spec

    root = Path(__file__).resolve().parents[1]
    exp = spec.load(root / "experiments" / "ruler.yaml")
    ropes = {a.run[a.run.index("--rope") + 1] for a in exp.arms.values()}
    assert ropes == {m for m, meth in REGISTRY.items() if meth.user}  # every method --rope may ask for
    assert list(exp.lengths) == [512, 1024, 2048, 4096]
    for a in exp.arms.values():
        rope = a.run[a.run.index("--rope") + 1]
        scale = a.run[a.run.index("--scale") + 1] if "--scale" in a.run else None
        assert "{length}" in a.run and scale == (None if rope in ("none", "abf") else "8"), a.name
        assert set(a.scores) == set(exp.scores)
    one_ref = {t for t, c in TASKS.items() if getattr(c, "num_v", 1) == 1 and getattr(c, "num_q", 1) == 1
               and type(c).__name__ == "NiahConfig"}
    assert one_ref == {"niah_single_1", "niah_single_2", "niah_multikey_1"}
    for key, s in exp.scores.items():
        task = s.file[len("ruler-"):-len(".jsonl")]
        if s.field == "ref_loss":  # the needle's digit loss: a mean
            assert s.kind == "mean" and task == "niah_single_1", key
        elif task in one_ref or task == "niah_grid":  # read / not read: a proportion (Wilson)
            assert s.kind == "proportion" and s.field.endswith("_hit"), key
        else:  # a share of references, the average, a loss: a mean
            assert s.kind == "mean" and not s.field.endswith("_hit"), key
    for fam in exp.families.values():
        assert sorted(fam.pairs) == sorted((a, "yarn") for a in exp.arms if a != "yarn")
    assert {f.score for f in exp.families.values()} == {"avg_gen", "avg_tf", "needle_loss"}


def test_tables_read_an_experiments_per_length_runs(tmp_path):
    from ropescale.probes.ruler.tables import load_runs

    seed = tmp_path / "runs" / "yarn" / "s0"
    for L, v in ((512, 1.0), (1024, 0.0)):
        d = seed / f"T{L}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"info": {"probe": "ruler", "orig_ctx": 512}}))
        (d / "items.jsonl").write_text(json.dumps({"id": f"vt:L{L}:0:gen", "task": "vt", "way": "gen", "col": L,
                                                   "value": v}) + "\n")
    [(name, recs, orig)] = load_runs([str(seed)])
    assert name == "yarn" and orig == 512 and sorted((r["col"], r["value"]) for r in recs) == [(512, 1.0), (1024, 0.0)]
    with pytest.raises(InputError, match="no run.json"):
        load_runs([str(tmp_path / "runs")])


def test_ruler_smollm2_experiment_the_budgeted_methods_tasks_and_family():
    from rope_scaling.formulas import REGISTRY
    from ropescale.experiments import spec

    root = Path(__file__).resolve().parents[1]
    exp = spec.load(root / "experiments" / "ruler_smollm2.yaml")
    assert list(exp.lengths) == [4096, 8192, 16384]
    # the methods the 90-minute budget names: none / PI / NTK / dynamic NTK / YaRN / LongRoPE / llama3 / ABF
    ropes = [a.run[a.run.index("--rope") + 1] for a in exp.arms.values()]
    assert sorted(ropes) == sorted(["none", "pi", "ntk", "dynamic_ntk", "yarn", "longrope", "llama3", "abf"])
    assert set(ropes) <= {m for m, meth in REGISTRY.items() if meth.user}
    for a in exp.arms.values():
        rope = a.run[a.run.index("--rope") + 1]
        scale = a.run[a.run.index("--scale") + 1] if "--scale" in a.run else None
        assert scale == (None if rope in ("none", "abf") else "2") and "{model}" in a.run, a.name
        assert set(a.scores) == set(exp.scores), a.name
    tasks = exp.vars["tasks"].split(",")
    assert tasks == ["niah_single_1", "niah_single_2", "niah_multikey_1"]  # one reference each: the average's hits
    assert exp.scores["avg_gen"].kind == "proportion" and exp.scores["avg_gen"].field == "gen_hit"
    fam = exp.families["method - YaRN x2 (needle loss)"]
    assert fam.score == "needle_loss" and sorted(fam.pairs) == sorted((r, "yarn") for r in ropes if r != "yarn")
