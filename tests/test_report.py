"""score / report: the paper's Table 7 -> Table 2, run directories, extrapolation, buckets, Fig. 3, bad input."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from ropescale.common.runs.identity import TrainLength
from ropescale.common.runs.record import RunDir, RunRecord
from ropescale.evaluation import score as SC
from ropescale.evaluation.cli import main as cli
from ropescale.evaluation.report.intake import build_report, read_scores_csv
from ropescale.evaluation.report.plot import moving_median
from ropescale.evaluation.report.render import render

DATA = Path(__file__).parent / "data"
TABLE7 = DATA / "cnnsum_table7.csv"  # CNNSum Appendix C, Table 7 (gray = Prompt-IE, white = Prompt-IB)
TABLE2 = DATA / "cnnsum_table2.csv"  # CNNSum Table 2 (average of the two prompts, MSE(P-IE vs P-IB))
F_SAME = 100 * 2.0 * (1.0 / (2.0 + 1e-8))  # rouge 1.0.1 F of identical texts (p = r = 1), x100


def run_cli(argv, capsys):
    rc = cli(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------- the paper's tables
def _table2():
    with open(TABLE2, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_table7_reproduces_table2(capsys):
    rc, out, _ = run_cli(["report", "--scores", str(TABLE7), "--format", "json"], capsys)
    assert rc == 0
    got = {k.casefold(): v for k, v in json.loads(out).items()}
    rows = _table2()
    assert len(rows) == 32 and len(got) == 32
    for row in rows:
        g = got[row["model"].casefold()]  # Table 7 writes ChatGLM3-6B-128k, Table 2 ChatGLM3-6B-128K
        for sub in ("L", "XL", "2XL", "3XL"):
            if row[sub] == "":
                assert sub not in g["avg"], row["model"]  # GPT-4o cannot process 3XL
            else:
                assert g["avg"][sub] == pytest.approx(float(row[sub]), abs=0.05 + 1e-9), (row["model"], sub)
        assert g["mse"] == pytest.approx(float(row["mse"]), abs=0.15), row["model"]


def test_table7_fixture_agrees_with_table3():
    """Table 3 prints six models of Table 7 again: the two transcriptions must agree."""
    table3 = {  # model: (IE L, XL, 2XL, 3XL), (IB L, XL, 2XL, 3XL), as printed in CNNSum Table 3
        "Yi-1.5-34B-32K": ((14.4, 12.7, 10.8, 0.1), (8.8, 8.2, 8.3, 0.1)),
        "Yi-1.5-34B-Chat-16K": ((15.4, 14.2, 12.1, 0.0), (12.1, 10.4, 9.7, 0.0)),
        "Llama3.1-8B": ((6.1, 6.6, 7.0, 2.2), (9.4, 9.4, 9.7, 3.9)),
        "Llama3.1-70B": ((11.8, 7.5, 5.2, 7.0), (12.5, 10.2, 8.6, 7.9)),
        "Qwen1.5-7B": ((16.5, 14.5, 7.0, 2.5), (7.7, 7.2, 4.4, 2.6)),
        "Qwen2-72B": ((12.1, 10.7, 10.3, 9.5), (17.5, 15.7, 13.1, 11.3)),
        "Qwen2-72B-Instruct": ((12.4, 10.5, 10.6, 10.6), (18.5, 15.8, 12.3, 7.8)),
    }
    rows = read_scores_csv(TABLE7)
    assert len(rows) == 32 * 8 - 2 * 2  # GPT-4o and GPT-4o-mini have no 3XL
    vals = {(r["model"], r["kind"], r["subset"]): r["rouge_l"] for r in rows}
    for model, (ie, ib) in table3.items():
        for kind, v in (("IE", ie), ("IB", ib)):
            assert tuple(vals[(model, kind, s)] for s in ("L", "XL", "2XL", "3XL")) == v, (model, kind)


def test_mse_is_over_the_models_subsets():
    rows = [
        {"model": "m", "prompt": "IE", "subset": "L", "rouge_l": 10.0},
        {"model": "m", "prompt": "IB", "subset": "L", "rouge_l": 13.0},
        {"model": "m", "prompt": "IE", "subset": "XL", "rouge_l": 8.0},
        {"model": "m", "prompt": "IB", "subset": "XL", "rouge_l": 7.0},
        # 3XL scored with neither prompt (GPT-4o in the paper): not one of m's subsets
    ]
    t2 = build_report(rows).table2()["m"]
    assert t2["mse"] == pytest.approx((9 + 1) / 2)
    assert t2["avg"] == {"L": 11.5, "XL": 7.5}


def test_table2_one_prompt_missing_is_missing_not_the_other_prompt():
    """Issue 15: a subset scored with IE only must not show IE's score as the IE/IB average, nor an MSE."""
    rows = [
        {"model": "m", "prompt": "IE", "subset": "L", "rouge_l": 10.0},
        {"model": "m", "prompt": "IB", "subset": "L", "rouge_l": 13.0},
        {"model": "m", "prompt": "IE", "subset": "XL", "rouge_l": 8.0},  # no IB for XL
        {"model": "ie-only", "prompt": "IE", "subset": "L", "rouge_l": 6.0},  # a model run with --prompts ie
    ]
    rep = build_report(rows)
    t2 = rep.table2()
    assert t2["m"]["avg"] == {"L": 11.5, "XL": None}
    assert t2["m"]["IB"] == {"L": 13.0, "XL": None} and t2["m"]["mse"] is None
    assert t2["ie-only"] == {"avg": {"L": None}, "mse": None, "IE": {"L": 6.0}, "IB": {"L": None}}
    js = json.loads(render(rep, "json", "table2"))
    assert js["m"]["avg"] == {"L": 11.5, "XL": None} and js["m"]["mse"] is None
    assert js["ie-only"]["IB"] == {"L": None}
    csv_rows = list(csv.reader(io.StringIO(render(rep, "csv", "table2"))))
    assert csv_rows[0] == ["model", "L", "XL", "mse", "mse_floor", "mse_lo", "mse_hi", "L_n", "L_lo", "L_hi", "XL_n",
                           "XL_lo", "XL_hi", "L_ie_minus_ib", "L_ie_minus_ib_lo", "L_ie_minus_ib_hi",
                           "XL_ie_minus_ib", "XL_ie_minus_ib_lo", "XL_ie_minus_ib_hi"]
    # the average of L from the CSV: two numbers (n 2), no interval; IE - IB: the difference alone (no floor)
    assert csv_rows[1:] == [["m", "11.5", "", "", "", "", "", "2", "", "", "", "", "", "-3.0", "", "", "", "", ""],
                            ["ie-only"] + [""] * 18]
    md = render(rep, "markdown", "table2")  # cells and IE - IB (with their intervals where there are any), n
    assert "| m | 11.50 | -3.00 | - | - | - | - | 2 |" in md and "| ie-only | - | - | - | - | - | - | - |" in md
    assert "only one of the two prompts" in md
    # the Table 7 view still shows the single prompt's scores
    t7 = render(rep, "markdown", "table7")
    assert "| m | 10.00 / 13.00 | 8.00 / - |" in t7 and "| ie-only | 6.00 / - | - / - |" in t7


def test_markdown_and_csv_views(capsys):
    rc, out, _ = run_cli(["report", "--scores", str(TABLE7)], capsys)
    assert rc == 0
    assert "Table 2 view" in out and "Table 7 view" in out
    # each subset's average, IE - IB beside it (a CSV's cells: one number per prompt, so no interval), MSE, n
    assert "| Qwen1.5-7B | 12.10 | +8.80 | 10.85 | +7.30 | 5.70 | +2.60 | 2.55 | -0.10 | 34.38 | - | 2 |" in out
    assert "| Qwen1.5-7B | 16.50 / 7.70 | 14.50 / 7.20 | 7.00 / 4.40 | 2.50 / 2.60 |" in out
    assert "| GPT-4o-2024-08-06 | 15.30 / 15.70 | 14.20 / 14.20 | 12.40 / 12.50 | - / - |" in out
    rc, out, _ = run_cli(["report", "--scores", str(TABLE7), "--format", "csv", "--view", "table7"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    # a scores CSV cell is one number: n 1, no interval; GPT-4o has no 3XL cell at all
    assert rows[0] == {"model": "GPT-4o-2024-08-06", "prompt": "IE", "L": "15.3", "XL": "14.2", "2XL": "12.4",
                       "3XL": "", **{f"{c}_n": "1" for c in ("L", "XL", "2XL")}, "3XL_n": "",
                       **{f"{c}_{x}": "" for c in ("L", "XL", "2XL", "3XL") for x in ("lo", "hi")}}
    rc, out, _ = run_cli(["report", "--scores", str(TABLE7), "--format", "csv"], capsys)
    head = next(csv.reader(io.StringIO(out)))
    assert head[:12] == ["model", "L", "XL", "2XL", "3XL", "mse", "mse_floor", "mse_lo", "mse_hi", "L_n", "L_lo",
                         "L_hi"] and head[21] == "L_ie_minus_ib"


@pytest.mark.parametrize("content,line,what", [
    ("model,prompt,subset\nm,IE,L\n", 1, "missing column"),
    ("model,prompt,subset,rouge_l\nm,IE,L,12.0\nm,IB,L,twelve\n", 3, "not a number"),
    ("model,prompt,subset,rouge_l\nm,IE,L,12.0\nm,IX,L,11.0\n", 3, "unknown prompt"),
    ("model,prompt,subset,rouge_l\nm,IE,L,12.0\nm,IE,L,11.0\n", 3, "duplicate"),
    ("model,prompt,subset,rouge_l\nm,IE,L,12.0,7\n", 2, "number of fields"),
    (b"model,prompt,subset,rouge_l\nm,IE,L,12.0\n\xff\xfe,IB,L,1\n", 3, "UTF-8"),
])
def test_bad_scores_csv(tmp_path, capsys, content, line, what):
    p = tmp_path / "s.csv"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(["report", "--scores", str(p), "--out", str(out_dir)], capsys)
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and f"{p}:{line}:" in err and what in err
    assert not out_dir.exists()


# ------------------------------------------------------------------------------------------ run directories
def make_run(root: Path, name: str, *, model="toy", rope=None, train=None, prompt="ie", subset="T2048",
             samples=(), data: Path | None = None, legacy: bool = False) -> Path:
    """A run directory as `eval_summ.py generate` writes it (run.json + predictions.jsonl); ``legacy``: the
    run.json layout of older versions (flat settings, ``args``, an integer ``train_length``)."""
    rd = RunDir(root / name)
    rope = rope or {"method": "none", "scale": 1.0}
    if legacy:
        rd.write_meta({"kind": "generate", "model": model, "rope": rope, "prompt": prompt, "subset": subset,
                       "backend": "hf", "train_length": (train or {}).get("length", {}).get("max"),
                       "args": {"data": str(data)} if data else {}})
    else:
        rd.write_record(RunRecord("generate", model=model, model_id="m-" + model, rope=rope, train=train,
                                  data=str(data) if data else None,
                                  settings={"prompt": prompt, "subset": subset, "backend": "hf"}))
    log = rd.log("predictions.jsonl")
    for i, (pred, ref, tokens) in enumerate(samples):
        log.append({"id": f"s{i}", "subset": subset, "prompt": prompt, "input_tokens": tokens,
                    "prediction": pred, "reference": ref})
    return rd.path


REF = "alpha beta gamma delta"
# hand-derived rouge 1.0.1 scores (x100) of ASCII word predictions against REF (jieba keeps ASCII words whole):
HALF = 100 * 2.0 * ((1.0 * 0.5) / (1.0 + 0.5 + 1e-8))  # "alpha beta": llcs 2, n 2, m 4 -> p 1, r 0.5
SAMPLES_A = [(REF, REF, 1000), ("alpha beta", REF, 1500), ("zeta eta", REF, 3000)]  # 100, HALF, 0
SAMPLES_B = [(REF, REF, 1200), ("", REF, 2500)]  # 100, 0 (empty)
TRAIN = {"id": "ft-ntk", "step": 24, "length": {"mean": 3900.4, "min": 3700, "max": 4096}}  # a training record


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    data = tmp_path / "data.jsonl"
    context = "宝玉和黛玉在园中读书，忽见一人走来。" * 3
    data.write_text("".join(json.dumps({"id": f"s{i}", "context": context, "summary": REF}, ensure_ascii=False)
                            + "\n" for i in range(3)), encoding="utf-8")
    ntk = {"method": "ntk", "scale": 8.0, "orig_ctx": 512}
    make_run(root, "ntk-ie", rope=ntk, train=TRAIN, prompt="ft-ie", samples=SAMPLES_A, data=data)
    make_run(root, "ntk-ib", rope=ntk, train=TRAIN, prompt="ft-ib", samples=SAMPLES_B, data=data)
    copy = [(context[:20], REF, 900)]  # a verbatim copy of the context
    make_run(root, "base-ie", prompt="ie", samples=SAMPLES_B + copy, data=data)
    make_run(root, "base-ie-4k", prompt="ie", subset="T4096", samples=[("alpha beta", REF, 4000)])
    return root


def test_score_run_writes_scores(runs):
    summary = SC.score_run(runs / "ntk-ie")
    assert summary["rouge_l"] == pytest.approx((F_SAME + HALF + 0.0) / 3, abs=1e-9)
    assert summary["n"] == 3 and summary["n_empty"] == 0
    assert (summary["rope"]["method"], summary["rope"]["scale"], summary["rope"]["orig_ctx"]) == ("ntk", 8.0, 512)
    assert summary["train_length"] == TRAIN["length"] and summary["train"] == TRAIN
    assert summary["prompt_kind"] == "IE"
    stored = json.loads((runs / "ntk-ie" / "scores.json").read_text(encoding="utf-8"))
    assert stored["rouge_l"] == summary["rouge_l"]
    samples = [json.loads(x) for x in (runs / "ntk-ie" / "sample_scores.jsonl").read_text().splitlines()]
    assert [s["rouge_l"] for s in samples] == pytest.approx([F_SAME, HALF, 0.0], abs=1e-9)
    assert [s["input_tokens"] for s in samples] == [1000, 1500, 3000]
    # stored scores are reused while predictions.jsonl is unchanged, recomputed once it changes
    assert SC.load_run_scores(runs / "ntk-ie")[2] is False
    RunDir(runs / "ntk-ie").log().append({"id": "s9", "prediction": REF, "reference": REF, "input_tokens": 10})
    s2, smp2, fresh = SC.load_run_scores(runs / "ntk-ie")
    assert fresh and s2["n"] == 4
    # another metric is never served from a cnnsum scores.json
    assert SC.load_run_scores(runs / "ntk-ie", "standard")[0]["metric"] == "standard"


def test_report_from_run_dirs(runs, tmp_path, capsys):
    rep = build_report([runs])
    assert len(rep.runs) == 4
    labels = [rep.label(s) for s in rep.series]
    assert sorted(labels) == ["toy · none (no fine-tune)", "toy · ntk x8 (ft 3900)"]
    t2 = rep.table2()
    ntk = t2["toy · ntk x8 (ft 3900)"]
    ie, ib = (F_SAME + HALF) / 3, F_SAME / 2
    assert ntk["IE"]["T2048"] == pytest.approx(ie) and ntk["IB"]["T2048"] == pytest.approx(ib)
    assert ntk["avg"]["T2048"] == pytest.approx((ie + ib) / 2)
    assert ntk["mse"] == pytest.approx((ie - ib) ** 2)
    base = t2["toy · none (no fine-tune)"]
    assert base["IE"] == pytest.approx({"T2048": F_SAME / 3, "T4096": HALF}) and base["mse"] is None
    cols, rows = rep.extrapolation()
    assert cols == ["T2048", "T4096"]
    by = {(r["setting"].rope.label(), r["setting"].train_length): r["cells"] for r in rows}
    tl = TrainLength(3900.4, 3700, 4096)
    assert by[("ntk x8", tl)]["T2048"] == pytest.approx((ie + ib) / 2)
    assert by[("ntk x8", tl)]["T4096"] is None
    assert by[("none", None)]["T2048"] == pytest.approx(F_SAME / 3)
    assert by[("none", None)]["T4096"] == pytest.approx(HALF)
    # failure modes: the empty prediction and the verbatim copy of the context
    fails = {Path(r["run"]).name: r for r in rep.failures()}
    assert fails["ntk-ib"]["empty"] == 0.5 and fails["ntk-ie"]["empty"] == 0.0
    assert fails["base-ie"]["copy"] == pytest.approx(1 / 3)
    assert fails["base-ie-4k"]["copy"] is None  # its run.json names no data file: unknown, not 0
    # the CLI prints all views and saves the scores it computed
    rc, out, _ = run_cli(["report", str(runs)], capsys)
    assert rc == 0
    for title in ("Table 2 view", "Table 7 view", "Extrapolation", "Failure modes"):
        assert title in out
    assert (runs / "ntk-ib" / "scores.json").is_file()


def test_length_buckets(runs, capsys):
    rep = build_report([runs], buckets=[1000, 2000])
    cols, rows = rep.extrapolation()
    assert cols == ["<1000", "1000-2000", ">=2000"]
    ntk = next(r for r in rows if r["setting"].rope.method == "ntk")["cells"]
    # IE samples: 1000 -> 100, 1500 -> HALF, 3000 -> 0; IB: 1200 -> 100, 2500 -> 0; cell = mean of prompts
    assert ntk["<1000"] is None
    assert ntk["1000-2000"] == pytest.approx(((F_SAME + HALF) / 2 + F_SAME) / 2)
    assert ntk[">=2000"] == pytest.approx(0.0)
    rc, out, _ = run_cli(["report", str(runs), "--buckets", "1000,2000", "--view", "extrapolation",
                          "--format", "csv"], capsys)
    assert rc == 0
    head = next(csv.reader(io.StringIO(out)))
    assert head == ["label", "model", "rope", "scale", "train_length", "train_length_min", "train_length_max",
                    *[f"{c}{x}" for c in ("<1000", "1000-2000", ">=2000") for x in ("", "_n", "_lo", "_hi")],
                    "effective_length_85", "effective_length_abs", "retention"]


def test_out_dir_and_plot(runs, tmp_path, capsys):
    out_dir, png = tmp_path / "tables", tmp_path / "fig3.png"
    rc, out, err = run_cli(["report", str(runs), "--out", str(out_dir), "--plot", str(png)], capsys)
    assert rc == 0
    for name in ("table2", "table7", "extrapolation", "failure_modes"):
        for ext in ("md", "csv", "json"):
            assert (out_dir / f"{name}.{ext}").stat().st_size > 0
    toy = json.loads((out_dir / "table2.json").read_text())["toy · none (no fine-tune)"]
    assert toy["avg"]["T4096"] is None and toy["IE"]["T4096"] == pytest.approx(HALF)  # toy has no IB run
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.shape[0] > 300 and img.shape[1] > 600  # two panels side by side
    assert img.std() > 0.01  # not a blank canvas
    assert not list(tmp_path.rglob(".*.tmp"))


def test_plot_needs_runs(tmp_path, capsys):
    png = tmp_path / "x.png"
    rc, _, err = run_cli(["report", "--scores", str(TABLE7), "--plot", str(png)], capsys)
    assert rc == 2 and "--plot needs run directories" in err and not png.exists()


def test_moving_median_hand_derived():
    assert moving_median([5, 1, 4, 2, 3], 3) == [3, 4, 2, 3, 2.5]
    assert moving_median([1, 2, 3], 1) == [1, 2, 3]
    vals = list(range(30))
    assert moving_median(vals, 15)[15] == 15 and moving_median(vals, 15)[0] == 3.5  # window clipped: 0..7


def test_bad_run_is_reported_and_nothing_written(runs, tmp_path, capsys):
    bad = runs / "ntk-ie" / "predictions.jsonl"
    lines = bad.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1][:-5]  # a malformed line 2
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out_dir, png = tmp_path / "tables", tmp_path / "fig.png"
    rc, out, err = run_cli(["report", str(runs), "--out", str(out_dir), "--plot", str(png)], capsys)
    assert rc == 2 and out == ""
    assert f"{bad}:2:" in err and err.count("\n") == 1
    assert not out_dir.exists() and not png.exists()
    assert not list(runs.rglob("scores.json"))  # the good runs were not written either


# ------------------------------------------------------------------------------------------------- score
def test_score_cli_json(tmp_path, capsys):
    p = tmp_path / "pred.jsonl"
    rows = [{"prediction": REF, "summary": REF}, {"prediction": "alpha beta", "reference": REF},
            {"prediction": "....", "reference": REF}, {"prediction": "", "reference": REF}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rc, out, _ = run_cli(["score", "--pred", str(p), "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["n"] == 4 and d["n_empty"] == 2 and d["metric"] == "cnnsum"
    assert d["rouge_l"] == pytest.approx((F_SAME + HALF) / 4, abs=1e-9)
    rc, out, _ = run_cli(["score", "--pred", str(p), "--json", "--metric", "standard"], capsys)
    std = json.loads(out)
    assert std["rouge_l"] == pytest.approx((100 + 100 * 2 * 0.5 / 1.5 + 0 + 0) / 4)  # P=1, R=.5 -> F1 2/3
    rc, out, _ = run_cli(["score", "--pred", str(p)], capsys)
    assert rc == 0 and f"{(F_SAME + HALF) / 4:.4f}" in out
    assert SC.score_file(p)["scores"] == pytest.approx([F_SAME, HALF, 0.0, 0.0], abs=1e-9)


@pytest.mark.parametrize("content,line,what", [
    ('{"prediction": "a", "reference": "b"}\n{"prediction": "a", "reference": \n', 2, "malformed JSON"),
    ('{"prediction": "a", "reference": "b"}\n{"prediction": "a"}\n', 2, "missing field"),
    (b'{"prediction": "a", "reference": "b"}\n{"prediction": "\xff", "reference": "b"}\n', 2, "UTF-8"),
    ('{"prediction": 3, "reference": "b"}\n', 1, "must be a string"),
])
def test_score_bad_input(tmp_path, capsys, content, line, what):
    p = tmp_path / "pred.jsonl"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc, out, err = run_cli(["score", "--pred", str(p), "--json"], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and f"{p}:{line}:" in err and what in err


def test_score_run_dir_cli(runs, capsys):
    rc, out, _ = run_cli(["score", "--pred", str(runs / "ntk-ib"), "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["rouge_l"] == pytest.approx(F_SAME / 2) and d["n_empty"] == 1
    assert (runs / "ntk-ib" / "scores.json").is_file() and (runs / "ntk-ib" / "sample_scores.jsonl").is_file()


def test_model_paths_and_generate_style_ids(tmp_path):
    """generate stores absolute model paths and numbers id-less data lines 1, 2, ... (its load_samples)."""
    data = tmp_path / "cnnsum_L_16k.jsonl"
    ctx = "宝玉和黛玉在园中读书，忽见一人走来。" * 3
    data.write_text(json.dumps({"context": "别的故事" * 20, "summary": REF}, ensure_ascii=False) + "\n\n"
                    + json.dumps({"context": ctx, "summary": REF}, ensure_ascii=False) + "\n", encoding="utf-8")
    root = tmp_path / "runs"
    a = make_run(root, "a", model="/data/a/exp1/merged", subset="L", samples=[], data=data)
    log = RunDir(a).log()
    log.append({"id": 1, "subset": "L", "input_tokens": 10, "prediction": ctx[:20], "reference": REF})
    log.append({"id": 3, "subset": "L", "input_tokens": 10, "prediction": ctx[:20], "reference": REF})
    make_run(root, "b", model="/data/b/exp1/merged", subset="L", samples=[(REF, REF, 10)])
    make_run(root, "c", model="/hub/cache/Qwen/Qwen1.5-7B", subset="L", samples=[(REF, REF, 10)])
    make_run(root, "d", model="tiny", subset="L", samples=[(REF, REF, 10)])
    rep = build_report([root])
    assert sorted(rep.labels[s].model for s in rep.series) == ["/data/a/exp1/merged", "/data/b/exp1/merged",
                                                               "Qwen/Qwen1.5-7B", "tiny"]
    fails = {Path(r["run"]).name: r for r in rep.failures()}
    assert fails["a"]["copy"] == 0.5  # id 3 = line 3 holds ctx (line 2 is blank); id 1's context is another text


def test_report_on_real_generate_output(make_tiny_model, chapters, tmp_path, capsys):
    """The run directories `eval_summ.py generate` writes (a tiny random model) go straight into score/report."""
    from ropescale.evaluation.generate import generate

    _, model_dir = make_tiny_model(orig_ctx=256)
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"context": c["text"][:200], "summary": c["title"]}, ensure_ascii=False)
                            + "\n" for c in chapters[:3]), encoding="utf-8")
    for p in ("ie", "ib"):
        generate(str(model_dir), str(data), p, str(tmp_path / "runs" / p), subset="T512", max_new_tokens=10,
                 progress=False, log=lambda *a, **k: None)
    png = tmp_path / "fig.png"
    rc, out, _ = run_cli(["report", str(tmp_path / "runs"), "--format", "json", "--view", "all",
                          "--plot", str(png)], capsys)
    assert rc == 0
    d = json.loads(out)
    (label, t2), = d["table2"].items()
    assert set(t2["IE"]) == set(t2["IB"]) == {"T512"}
    fails = d["failures"]
    assert [f["n"] for f in fails] == [3, 3]
    assert all(f["copy"] is not None for f in fails)  # contexts found through run.json's data path
    for p in ("ie", "ib"):
        s = json.loads((tmp_path / "runs" / p / "scores.json").read_text(encoding="utf-8"))
        assert s["n"] == 3 and s["prompt_kind"] == p.upper()
        smp = (tmp_path / "runs" / p / "sample_scores.jsonl").read_text(encoding="utf-8").splitlines()
        assert all(json.loads(x)["input_tokens"] > 0 for x in smp)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
