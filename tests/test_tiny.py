"""The tiny default (issue 14): a build is deterministic (same weights bit for bit), the committed asset is the
default and is checked against its sha256, and what the build measures is recorded. The builder has its own room
(issue 35.2): ``--model tiny`` resolves the committed asset and never builds; only ``make-tiny --build`` builds."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ropescale.common.models as models
import ropescale.tiny.build as tiny
from ropescale.common.io import InputError, sha256_file

ROOT = Path(__file__).resolve().parent.parent
MINI = tiny.TinySpec(vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     orig_ctx=512, tokenizer_chars=150_000, steps=4, batch_size=2, warmup=2, short_steps=2,
                     short_len=32, short_batch=4, heldout_per_book=3, heldout_windows=2)


@pytest.fixture(scope="module")
def small_chapters(tmp_path_factory, chapters):
    """Two books of 10 chapters each from the shared novels (keeps the build's tokenizing fast)."""
    rows, per = [], {}
    for c in chapters:
        if per.get(c["book"], 0) < 10 and c["book"] in ("sanguo_yanyi", "xiyou_ji"):
            per[c["book"]] = per.get(c["book"], 0) + 1
            rows.append(c)
    p = tmp_path_factory.mktemp("chs") / "chapters.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return p


def test_build_is_deterministic(tmp_path, small_chapters):
    # the recall score (greedy answers of up to 160 tokens to 12 samples a prompt: most of a build's time) on one
    # sample with 8 new tokens: it runs after the weights are final, and only the files are compared
    small = {"recall_n": 1, "recall_new_tokens": 8}
    a = tiny.build_tiny(MINI, tmp_path / "a", chapters_path=small_chapters, log=lambda m: None, **small)
    b = tiny.build_tiny(MINI, tmp_path / "b", chapters_path=small_chapters, log=lambda m: None, **small)
    for f in (models.MODEL_FILE, "tokenizer.json", "config.json"):
        assert sha256_file(a / f) == sha256_file(b / f), f
    info = json.loads((a / "tiny.json").read_text(encoding="utf-8"))
    assert info["key"] == MINI.key() and info["sha256"][models.MODEL_FILE] == sha256_file(a / models.MODEL_FILE)
    for k in ("ppl_heldout", "ppl_heldout_random", "copy_loss", "nocopy_loss", "recall_rouge_l", "train_log"):
        assert k in info
    assert set(info["recall_rouge_l"]) == {"ft-ie", "ft-ib"}
    # the held-out chapters are the last ones of each book, and the build says which
    assert info["heldout_chapters"] == ["sanguo_yanyi:8", "sanguo_yanyi:9", "sanguo_yanyi:10",
                                        "xiyou_ji:8", "xiyou_ji:9", "xiyou_ji:10"]


def test_mixture_phases(small_chapters, tiny_tokenizer):
    from ropescale.common.chapters import read_chapters
    from ropescale.common.recall import sources, split_part

    chs = split_part(read_chapters(small_chapters), "train", 3)
    ids = tiny_tokenizer("".join(c.text for c in chs), add_special_tokens=False)["input_ids"]
    from ropescale.tiny.mixture import Mixture

    mix = Mixture(MINI, tiny_tokenizer, ids, sources(chs, tiny_tokenizer), seed=0)
    first, later = mix.batch(0), mix.batch(MINI.short_steps)
    assert len(first) == MINI.short_batch and all(len(w) == MINI.short_len for w in first)
    assert len(later) == MINI.batch_size and all(len(w) == MINI.orig_ctx for w in later)
    # a recall window holds the F.2 prompt, the marked sentences as the answer, then EOS
    w = mix.recall(MINI.orig_ctx)
    text = tiny_tokenizer.decode(w)
    assert "[摘要]" in text and "【1】" in text and tiny_tokenizer.eos_token_id in w
    # synthetic windows are repeats: every token after the first block is predictable by looking back
    s = mix.synthetic(64)
    assert len(s) == 64 and len(set(s)) < 40


def test_the_committed_asset_is_the_default_and_is_checked(tmp_path, monkeypatch):
    info = models.asset_info()
    assert info is not None, "assets/tiny is missing"
    assert info["key"] == tiny.DEFAULT_SPEC.key(), "assets/tiny was built from another spec: rebuild it"
    assert models.resolve_model("tiny") == models.ASSET_DIR == tiny.built(tiny.DEFAULT_SPEC)
    assert sha256_file(models.ASSET_DIR / models.MODEL_FILE) == info["sha256"][models.MODEL_FILE]
    # a damaged copy is refused with a clear line
    bad = tmp_path / "tiny"
    shutil.copytree(models.ASSET_DIR, bad)
    with open(bad / models.MODEL_FILE, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    monkeypatch.setattr(models, "ASSET_DIR", bad)
    with pytest.raises(InputError, match="sha256"):
        models.resolve_model("tiny")


def test_model_tiny_never_builds(tmp_path, monkeypatch, capsys):
    """A missing asset is one line saying how to get it back, not an hour of pretraining; so is make-tiny without
    --build for a spec nobody built."""
    from ropescale.tiny.make_tiny import main

    def refuse(*a, **k):
        raise AssertionError("the builder ran")

    monkeypatch.setattr(tiny, "build_tiny", refuse)
    monkeypatch.setattr(models, "ASSET_DIR", tmp_path / "gone")
    with pytest.raises(InputError, match=r"missing .*make-tiny --build"):
        models.resolve_model("tiny")
    monkeypatch.setattr(tiny, "CACHE_DIR", tmp_path / "cache")
    assert main(["--steps", "7"]) == 2
    assert "no build of this spec (steps 7) yet: make-tiny --build" in capsys.readouterr().err


def _imported(f: Path) -> set[str]:
    """The modules file ``f`` imports anywhere (function bodies too), relative imports made absolute."""
    import ast

    pkg = ".".join(f.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def test_the_floor_and_the_stages_import_no_builder():
    """ropescale/common (where a model is), rope_scaling and the stages never import ropescale.tiny, in the source
    and at run time: resolving, checking and loading the tiny default leave the builder unimported."""
    stages = ["ropescale/common", "rope_scaling", "data_concat", "ropescale/training", "ropescale/evaluation",
              "ropescale/probes"]
    bad = [str(f.relative_to(ROOT)) for d in stages for f in sorted((ROOT / d).rglob("*.py"))
           if any(m == "ropescale.tiny" or m.startswith("ropescale.tiny.") for m in _imported(f))]
    assert bad == [], bad
    code = ("import sys; from ropescale.common.models import resolve_model; from rope_scaling.load import "
            "load_config; import ropescale.common.runs, ropescale.training.run, ropescale.evaluation.generate, "
            "ropescale.probes.common; load_config(resolve_model('tiny')); "
            "print(sorted(m for m in sys.modules if m.startswith('ropescale.tiny')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
