"""eval_summ generate: batched greedy == plain batch-1 generate, prompts, subsets, run.json, RoPE handling,
truncation, bad input, and resume after a real kill -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ropescale.common.io import InputError

ROOT = Path(__file__).resolve().parent.parent

# The baseline prompts as the issue quotes them (independent of common/prompts.py).
RELEASE_IE = "下面是一个小说节选，内容如下：\n\n{}\n\n请你阅读以上内容后写出相应的摘要，不要输出其他任何内容。\n\n摘要："  # noqa: E501  (verbatim)
PAPER_IB = "下面是一个小说节选，请你阅读后写出相应的摘要，不要输出其他任何内容。\n小说节选如下：\n\n{}\n\n摘要："
FT_IE = "[原文_开始]\n{}\n[原文_结束]\n\n以上[原文_开始][原文_结束]之中的内容来自一本小说，请对其进行摘要。\n[摘要]\n"


def write_data(path: Path, chapters, n: int, base: int = 60, step: int = 23, with_id: bool = True) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            ch = chapters[i % len(chapters)]
            row = {"context": ch["text"][: base + step * i], "summary": ch["title"]}
            if with_id:
                row["id"] = f"s{i:03d}"
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def varied(make_tiny_model, arch="qwen2", seed=0, **kw):
    """A tiny random model whose weight matrices are redrawn with std 0.3: at the default init a random model
    repeats one token forever, which would make equality tests nearly vacuous; this one emits varied tokens."""
    import torch

    model, d = make_tiny_model(arch, seed=seed, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(d)
    return model, d


@pytest.fixture(scope="module")
def model(make_tiny_model):
    return varied(make_tiny_model, "qwen2", orig_ctx=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory, chapters):
    return write_data(tmp_path_factory.mktemp("data") / "eval.jsonl", chapters, 10)


def read_preds(out) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------ batching changes nothing but speed
def test_plan_batches_by_token_budget():
    from ropescale.evaluation.backends.hf import plan_batches

    # lengths 100, 90, 50, 40, 10 with 10 new tokens and a 300-token budget: longest first;
    # [100, 90] costs 2*110 = 220 (a third would cost 330); [50, 40, 10] costs 3*60 = 180.
    assert plan_batches([50, 100, 10, 90, 40], 10, 300, 8) == [[1, 3], [0, 4, 2]]
    assert plan_batches([50, 100, 10, 90, 40], 10, 300, 2) == [[1, 3], [0, 4], [2]]
    assert plan_batches([1000], 10, 5, 8) == [[0]]  # one sample always fits


def test_cpu_slot_budget(monkeypatch):
    """On CPU the slot count comes from 32K tokens or 512 MiB of KV cache, whichever holds more, at most a quarter
    of the RAM. Hand-worked: the tiny default (4 layers, 2 KV heads of 64, fp32) keeps 2*4*2*64*4 = 4,096 bytes a
    token, so 512 MiB is 131,072 tokens: 16 slots of a 4,096-token prompt + 2 x 128; a 7B MHA shape (32 layers,
    32 x 128, fp32: 1 MiB a token) stays at 32K tokens when RAM allows, else a quarter of the RAM."""
    from types import SimpleNamespace

    import torch

    from ropescale.evaluation.backends import hf

    def slots(cfg, longest, new, ram_gib=24, max_batch=64):
        page = 4096
        monkeypatch.setattr(hf.os, "sysconf",
                            lambda k: page if k == "SC_PAGE_SIZE" else ram_gib * 2 ** 30 // page)
        be = SimpleNamespace(batch_tokens=None, device="cpu", dtype=torch.float32, max_batch=max_batch,
                             model=SimpleNamespace(config=cfg))
        return hf.SlotDecoding(be).slots(new, longest)

    tiny = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=256, num_hidden_layers=4)
    assert slots(tiny, 3968, 128) == 131072 // (3968 + 256) == 31  # 7 with 32K tokens
    assert slots(tiny, 4096, 128, max_batch=16) == 16
    big = SimpleNamespace(num_attention_heads=32, num_key_value_heads=32, hidden_size=4096, num_hidden_layers=32)
    assert slots(big, 1792, 128, ram_gib=256) == 32768 // 2048 == 16
    assert slots(big, 1792, 128, ram_gib=24) == (6 * 1024) // 2048 == 3  # a quarter of 24 GiB holds 6,144 tokens


@pytest.fixture(scope="module")
def batch1_refs():
    """Plain batch-1 generate's answers by arch, computed once: every parametrization of an arch builds the same
    model (the same seed), checked by its weights' bytes."""
    return {}


def _weights_key(model) -> tuple:
    return tuple((n, p.detach().numpy().tobytes()) for n, p in model.state_dict().items())


@pytest.mark.parametrize("arch,cache,slots", [("qwen2", "static", 4), ("qwen2", "dynamic", 4), ("llama", "static", 4),
                                              ("qwen2", "slots", 4), ("llama", "slots", 4), ("qwen2", "slots", 2),
                                              ("llama", "slots", 1)])
def test_batched_greedy_equals_plain_batch1_generate(make_tiny_model, tiny_tokenizer, chapters, arch, cache, slots,
                                                     batch1_refs):
    import torch

    from ropescale.evaluation.backends import BackendSettings, HFBackend, Item

    model, d = varied(make_tiny_model, arch, orig_ctx=64, seed=3)
    texts = [chapters[i]["text"][: 40 + 37 * i] for i in range(5)]
    seqs = [tiny_tokenizer(t)["input_ids"] for t in texts]
    assert len({len(s) for s in seqs}) == len(seqs)  # all different: every batch is padded
    max_new, min_new = 20, 10

    def plain(eos):
        outs = []
        for s in seqs:
            o = model.generate(input_ids=torch.tensor([s]), attention_mask=torch.ones(1, len(s), dtype=torch.long),
                               do_sample=False, max_new_tokens=max_new, min_new_tokens=min_new, eos_token_id=eos,
                               pad_token_id=tiny_tokenizer.pad_token_id)
            row = o[0, len(s):].tolist()
            outs.append(row[: row.index(eos)] if eos in row else row)
        return outs

    key = _weights_key(model)
    if arch not in batch1_refs:  # on this parametrization's model, before the backend has touched it
        free = plain(eos=len(tiny_tokenizer) - 1)  # an id the random model never picks here
        # EOS = the token the model emits most: rows then stop at different steps, some before min_new_tokens
        # would allow (it must be suppressed there)
        early = {t for o in free for t in o[:min_new]}
        late = [t for o in free for t in o[min_new:] if t in early]
        eos = max(set(late), key=late.count)
        batch1_refs[arch] = (key, free, eos, plain(eos))
    ref_key, free, eos, ref = batch1_refs[arch]
    assert key == ref_key  # the same model as the answers were generated with
    assert all(len(o) == max_new for o in free)
    assert any(len(o) < max_new for o in ref)  # EOS stopped some rows early ...
    assert any(len(o) == max_new for o in ref)  # ... and not others
    per = len(seqs[-1]) + (2 if cache == "slots" else 1) * max_new  # a slot holds prompt + 2 x max_new
    be = HFBackend(d, model.config, tiny_tokenizer, BackendSettings(batch_tokens=slots * per, cache=cache), model=model)
    assert be.cache == cache
    be.eos = [eos]
    got = {}
    be.generate([Item(i, s) for i, s in enumerate(seqs)], max_new, min_new, lambda it, o: got.__setitem__(it.id, o))
    assert [got[i] for i in range(len(seqs))] == ref
    assert all(len(o) >= min_new for o in ref)
    if cache == "slots" and slots == 2:  # 5 samples through 2 slots: refills mid-run force left shifts
        assert be.compactions > 0


# ------------------------------------------------------------------ prompts, subsets, run.json
@pytest.mark.parametrize("prompt,style,template", [("ie", "release", RELEASE_IE), ("ib", "paper", PAPER_IB),
                                                   ("ft-ie", "release", FT_IE)])
def test_prompt_selection(model, data, tiny_tokenizer, tmp_path, prompt, style, template):
    from ropescale.evaluation.generate import generate, load_samples

    out = tmp_path / "run"
    generate(str(model[1]), data, prompt, out, prompt_style=style, max_new_tokens=10, limit=3, progress=False)
    samples = {s["id"]: s for s in load_samples(data)}
    for r in read_preds(out):
        expect = tiny_tokenizer(template.replace("{}", samples[r["id"]]["context"]))["input_ids"]
        assert r["input_tokens"] == len(expect)
        assert r["prompt"] == prompt and r["reference"] == samples[r["id"]]["reference"]
    meta = json.loads((out / "run.json").read_text())["settings"]
    assert meta["prompt"] == prompt
    assert meta["prompt_style"] == (style if prompt in ("ie", "ib") else None)


def test_tokenize_renders_the_quoted_prompt(tiny_tokenizer):
    from ropescale.evaluation.generate import Tokenize

    ids = Tokenize(tiny_tokenizer, "ie", "release", False).ids("正文")
    assert tiny_tokenizer.decode(ids) == RELEASE_IE.replace("{}", "正文")
    with pytest.raises(InputError, match="chat template"):
        Tokenize(tiny_tokenizer, "ie", "release", True)


def test_subset_detection_and_max_new_tokens(model, chapters, tmp_path):
    from ropescale.evaluation.generate import default_max_new_tokens, generate, resolve_subset

    assert resolve_subset(None, "x/cnnsum_L_16k.jsonl").name == "L"
    assert resolve_subset(None, "cnnsum_XXL_64k.jsonl").name == "2XL"
    assert resolve_subset(None, "cnnsum_XXXL_128k.jsonl").name == "3XL"
    assert resolve_subset("xl", "whatever.jsonl").name == "XL"
    assert resolve_subset(None, "mine.jsonl") is None
    t = resolve_subset("T2048", "mine.jsonl")
    assert (t.target, t.range) == (2048, (2048 - 512, 2048 + 256))  # L's [-4K, +2K] scaled by 1/8

    assert [default_max_new_tokens(resolve_subset(None, f"cnnsum_{n}.jsonl")) for n in
            ("L_16k", "XL_32k", "XXL_64k", "XXXL_128k")] == [400, 400, 500, 500]  # paper Sec 4.2
    d = write_data(tmp_path / "cnnsum_XXL_64k.jsonl", chapters, 1)
    generate(str(model[1]), d, "ib", tmp_path / "a", max_new_tokens=12, progress=False)
    meta = json.loads((tmp_path / "a" / "run.json").read_text())["settings"]
    assert (meta["subset"], meta["max_new_tokens"]) == ("2XL", 12)
    assert read_preds(tmp_path / "a")[0]["subset"] == "2XL"
    d2 = write_data(tmp_path / "cnnsum_L_16k.jsonl", chapters, 1)
    with pytest.raises(InputError, match="different settings"):  # resuming into a dir made for another subset
        generate(str(model[1]), d2, "ib", tmp_path / "a", max_new_tokens=12, progress=False)
    with pytest.raises(InputError, match="--subset or --max-new-tokens"):
        default_max_new_tokens(None, "mine.jsonl")
    with pytest.raises(InputError, match="--subset or --max-new-tokens"):
        generate(str(model[1]), write_data(tmp_path / "mine.jsonl", chapters, 1), "ib", tmp_path / "b")


def test_run_json_contents_and_train_length(make_tiny_model, data, tmp_path):
    import shutil

    from ropescale.evaluation.generate import generate

    _, d = make_tiny_model("qwen2", orig_ctx=64)
    train = tmp_path / "train" / "tiny-ntk-x4"
    shutil.copytree(d, train / "merged")
    (train / "run.json").write_text(json.dumps({"kind": "finetune", "train_length": 192}))
    out = tmp_path / "run"
    res = generate(str(train / "merged"), data, "ft-ib", out, max_new_tokens=12, limit=4, progress=False)
    meta = json.loads((out / "run.json").read_text())
    st, info = meta["settings"], meta["info"]
    assert meta["kind"] == "generate" and meta["model"] == str((train / "merged").resolve())
    assert meta["train"]["length"] == {"mean": None, "min": None, "max": 192}  # an older finetune run.json: max only
    assert meta["rope"]["method"] == "none" and meta["rope"]["scale"] == 1.0
    assert (st["prompt"], st["prompt_style"], st["backend"], st["subset"]) == ("ft-ib", None, "hf", None)
    assert st["max_new_tokens"] == 12 and st["min_new_tokens"] == 10
    assert meta["status"] == "complete" and info["counts"]["done"] == 4 == res["done"]
    assert {"torch", "transformers", "python"} <= set(meta["versions"])
    assert meta["context"] == 64
    recs = read_preds(out)
    assert {"id", "subset", "prompt", "input_tokens", "prediction", "reference"} <= set(recs[0])
    assert all(10 <= r["new_tokens"] <= 12 for r in recs)
    # over_context: prompt + max new tokens beyond the 64-token context, counted independently here
    assert info["counts"]["over_context"] == sum(r["input_tokens"] + 12 > 64 for r in recs)


# ------------------------------------------------------------------ RoPE
def test_rope_flags_vs_saved_scaling(make_tiny_model, data, tmp_path):
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, apply_rope
    from ropescale.evaluation.generate import generate

    _, d = varied(make_tiny_model, "qwen2", orig_ctx=64, seed=1)
    # the same model saved with NTK x4 in its config
    cfg = AutoConfig.from_pretrained(d)
    apply_rope(cfg, RopeSpec("ntk", 4.0))
    import shutil

    saved = tmp_path / "saved"
    shutil.copytree(d, saved)
    cfg.save_pretrained(saved)

    kw = dict(max_new_tokens=16, limit=4, progress=False)
    generate(str(d), data, "ie", tmp_path / "flags", rope=RopeSpec("ntk", 4.0), **kw)
    generate(str(saved), data, "ie", tmp_path / "as_saved", **kw)
    generate(str(d), data, "ie", tmp_path / "plain", **kw)
    flags, as_saved, plain = (read_preds(tmp_path / n) for n in ("flags", "as_saved", "plain"))
    assert [r["prediction"] for r in flags] == [r["prediction"] for r in as_saved]
    assert [r["prediction"] for r in flags] != [r["prediction"] for r in plain]  # the rope setting was used
    m_saved = json.loads((tmp_path / "as_saved" / "run.json").read_text())
    assert (m_saved["rope"]["method"], m_saved["rope"]["scale"], m_saved["context"]) == ("ntk", 4.0, 256)

    with pytest.raises(InputError, match="--replace"):
        generate(str(saved), data, "ie", tmp_path / "x", rope=RopeSpec("pi", 2.0), **kw)
    generate(str(saved), data, "ie", tmp_path / "y", rope=RopeSpec("pi", 2.0, replace=True), **kw)
    m = json.loads((tmp_path / "y" / "run.json").read_text())
    assert (m["rope"]["method"], m["rope"]["scale"]) == ("pi", 2.0)


# ------------------------------------------------------------------ long inputs
def test_middle_truncation(model, data, tiny_tokenizer, tmp_path):
    from ropescale.evaluation.generate import generate, load_samples

    out = tmp_path / "t"
    generate(str(model[1]), data, "ie", out, max_new_tokens=10, truncate="middle", max_input_tokens=250,
             progress=False)
    recs = {r["id"]: r for r in read_preds(out)}
    lens = {s["id"]: len(tiny_tokenizer(RELEASE_IE.replace("{}", s["context"]))["input_ids"])
            for s in load_samples(data)}
    assert any(n > 250 for n in lens.values()) and any(n <= 250 for n in lens.values())
    for rid, n in lens.items():
        assert recs[rid]["truncated"] == (n > 250)
        assert recs[rid]["input_tokens"] == n if n <= 250 else 240 <= recs[rid]["input_tokens"] <= 250
    meta = json.loads((out / "run.json").read_text())
    assert meta["info"]["counts"]["truncated"] == sum(n > 250 for n in lens.values())
    # the kept text = the prompt head + the context's head ... tail + the prompt tail
    from ropescale.evaluation.generate import Tokenize

    s = max(load_samples(data), key=lambda s: len(s["context"]))
    ids, cut = Tokenize(tiny_tokenizer, "ie", "release", False).middle_truncated(s["context"], 250)
    text = tiny_tokenizer.decode(ids)
    head, tail = RELEASE_IE.split("{}")
    assert cut and text.startswith(head + s["context"][:5]) and text.endswith(s["context"][-5:] + tail)
    with pytest.raises(InputError, match="--truncate middle"):
        generate(str(model[1]), data, "ie", tmp_path / "u", max_new_tokens=10, max_input_tokens=50)


# ------------------------------------------------------------------ bad input
def test_bad_input_names_file_and_line(model, tmp_path, capsys):
    from ropescale.evaluation.cli import main
    from ropescale.evaluation.generate import load_samples

    p = tmp_path / "bad.jsonl"
    p.write_text('{"context": "甲", "summary": "乙"}\n{"context": "甲"\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.jsonl:2: malformed JSON"):
        load_samples(p)
    p.write_text('{"context": "甲", "summary": "乙"}\n\n{"context": "丙"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.jsonl:3: missing field\(s\) 'summary'"):
        load_samples(p)
    p.write_text('{"id": 1, "context": "甲", "summary": "乙"}\n{"id": 1, "context": "丙", "summary": "丁"}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2: duplicate id 1"):
        load_samples(p)
    p.write_text('{"context": "", "summary": "乙"}\n')
    rc = main(["generate", "--model", str(model[1]), "--data", str(p), "--prompt", "ie", "--out",
               str(tmp_path / "o"), "--max-new-tokens", "10"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "bad.jsonl:1: 'context' must be a non-empty string" in err[-1]
    assert not (tmp_path / "o").exists()


def test_ids_default_to_line_numbers(model, chapters, tmp_path):
    from ropescale.evaluation.generate import load_samples

    p = write_data(tmp_path / "noid.jsonl", chapters, 3, with_id=False)
    assert [s["id"] for s in load_samples(p)] == [1, 2, 3]


def test_vllm_backend_absent_is_a_clear_error(model, data, tmp_path):
    import importlib.util

    from ropescale.evaluation.generate import generate

    assert importlib.util.find_spec("vllm") is None  # this environment has no vllm (a GPU extra)
    with pytest.raises(InputError, match="vllm"):
        generate(str(model[1]), data, "ie", tmp_path / "v", backend="vllm", max_new_tokens=10, progress=False)
    assert not (tmp_path / "v").exists()  # nothing written for a backend that cannot start


# ------------------------------------------------------------------ resume after kill -9
def test_resume_after_kill9_no_duplicates_same_predictions(make_tiny_model, chapters, tmp_path):
    from ropescale.evaluation.generate import generate

    _, d = varied(make_tiny_model, "qwen2", orig_ctx=64, seed=2)
    data = write_data(tmp_path / "eval.jsonl", chapters, 16, base=30, step=9)
    out = tmp_path / "killed"
    cmd = [sys.executable, str(ROOT / "eval_summ.py"), "generate", "--model", str(d), "--data", str(data),
           "--prompt", "ib", "--out", str(out), "--max-new-tokens", "24", "--max-batch", "1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    preds = out / "predictions.jsonl"
    deadline = time.time() + 45
    while time.time() < deadline and proc.poll() is None:
        if preds.exists() and preds.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "generate finished (or failed) before it could be killed: " + \
        proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    n_before = preds.read_bytes().count(b"\n")
    assert 2 <= n_before < 16
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "running"

    # resumed with the default batching (batching changes nothing but speed)
    res = generate(str(d), data, "ib", out, max_new_tokens=24, progress=False)
    assert res["generated"] == 16 - n_before
    recs = read_preds(out)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) == 16
    assert json.loads((out / "run.json").read_text())["status"] == "complete"

    generate(str(d), data, "ib", tmp_path / "whole", max_new_tokens=24, max_batch=1, progress=False)  # uninterrupted
    whole = {r["id"]: r for r in read_preds(tmp_path / "whole")}
    assert {r["id"]: r["prediction"] for r in recs} == {k: r["prediction"] for k, r in whole.items()}
    assert generate(str(d), data, "ib", out, max_new_tokens=24, progress=False)["generated"] == 0


def test_slot_decoder_frees_its_buffers_without_gc(make_tiny_model, tiny_tokenizer, chapters, monkeypatch):
    """The slot buffers are the size of the GPU: once generate returns, nothing may pin them (a reference cycle
    did once, and the next allocation ran out of memory)."""
    import gc
    import weakref

    from ropescale.evaluation import engine
    from ropescale.evaluation.backends import BackendSettings, HFBackend, Item

    model, d = make_tiny_model("qwen2", orig_ctx=64, seed=1)
    refs = []
    init = engine.SlotCache.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        refs.append(weakref.ref(self))

    monkeypatch.setattr(engine.SlotCache, "__init__", spy)
    be = HFBackend(d, model.config, tiny_tokenizer, BackendSettings(cache="slots"), model=model)
    seqs = [tiny_tokenizer(chapters[i]["text"][:60])["input_ids"] for i in range(3)]
    got = {}
    gc.disable()
    try:
        be.generate([Item(i, s) for i, s in enumerate(seqs)], 12, 10, lambda it, o: got.__setitem__(it.id, o))
        assert len(got) == 3 and refs
        assert all(r() is None for r in refs)
    finally:
        gc.enable()


# ------------------------------------------------------------------ dynamic NTK (issue 15.6)
@pytest.mark.parametrize("cache,slots", [("slots", 3), ("slots", 1), ("static", 1)])
def test_dynamic_ntk_each_sample_as_batch1_generate_on_a_fresh_model(make_tiny_model, tiny_tokenizer, chapters,
                                                                     cache, slots, batch1_refs):
    """transformers' dynamic NTK keeps the largest base it has computed; the queue is longest-first, so without a
    reset every later sample reused the longest one's base. Each sample must come out as batch-1 generate on a
    freshly loaded model gives it (fp32), with several slots of different lengths decoding together too."""
    import copy

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_scaling import RopeSpec, apply_rope
    from ropescale.evaluation.backends import BackendSettings, HFBackend, Item

    _, d = varied(make_tiny_model, "qwen2", orig_ctx=64, seed=5)
    cfg = AutoConfig.from_pretrained(d)
    apply_rope(cfg, RopeSpec("dynamic_ntk", 4.0))
    model = AutoModelForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    rot = model.model.rotary_emb
    assert rot.rope_type == "dynamic"
    fresh = copy.deepcopy(model)  # the untouched state, copied for every reference sample
    texts = [chapters[i]["text"][: 70 + 53 * i] for i in range(5)]
    seqs = [tiny_tokenizer(t)["input_ids"] for t in texts]
    assert min(map(len, seqs)) > 64 and len({len(s) for s in seqs}) == 5  # all beyond the original context
    max_new, eos = 12, len(tiny_tokenizer) - 1

    longest = max(seqs, key=len)
    key = _weights_key(model)
    if "dynamic_ntk" not in batch1_refs:  # computed once (every parametrization builds the same model)
        ref = []
        for s in seqs:
            m = copy.deepcopy(fresh)
            o = m.generate(input_ids=torch.tensor([s]), attention_mask=torch.ones(1, len(s), dtype=torch.long),
                           do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=eos,
                           pad_token_id=tiny_tokenizer.pad_token_id)
            ref.append(o[0, len(s):].tolist())
        # the test has teeth: the longest sample's base gives other tokens to a shorter one
        stale = copy.deepcopy(fresh)
        stale.generate(input_ids=torch.tensor([longest]), max_new_tokens=2, do_sample=False, eos_token_id=eos,
                       pad_token_id=tiny_tokenizer.pad_token_id)
        s0 = seqs[0]
        o = stale.generate(input_ids=torch.tensor([s0]), attention_mask=torch.ones(1, len(s0), dtype=torch.long),
                           do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=eos,
                           pad_token_id=tiny_tokenizer.pad_token_id)
        batch1_refs["dynamic_ntk"] = (key, ref, o[0, len(s0):].tolist())
    ref_key, ref, stale_first = batch1_refs["dynamic_ntk"]
    assert key == ref_key  # the same model as the answers were generated with
    assert stale_first != ref[0]

    per = len(longest) + 2 * max_new
    be = HFBackend(d, model.config, tiny_tokenizer, BackendSettings(batch_tokens=slots * per, max_batch=slots,
                                                                    cache=cache), model=model)
    assert be.cache == cache
    be.eos = [eos]
    got = {}
    be.generate([Item(i, s) for i, s in enumerate(seqs)], max_new, max_new, lambda it, o: got.__setitem__(it.id, o))
    assert [got[i] for i in range(len(seqs))] == ref
