"""Helpers for the finetune tests: tiny packed data built with data_concat from real novel text."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_pairs(chapters, path: Path, n: int = 40, ctx_chars: int = 90) -> Path:
    """n short {context, summary} pairs: a slice of a chapter's text -> its heading couplet."""
    rows = []
    for i, ch in enumerate(chapters[::7][:n]):
        rows.append({"id": f"p{i}", "context": ch["text"][:ctx_chars], "summary": ch["title"]})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def packed(chapters, tokenizer_dir, out: Path, lo: int, hi: int, n: int = 40, seed: int = 0) -> Path:
    from data_concat import pack

    pairs = write_pairs(chapters, out.parent / f"{out.name}-pairs.jsonl", n=n)
    pack(pairs, tokenizer_dir, out, min_tokens=lo, max_tokens=hi, prompt="mix", seed=seed)
    return out


def run_env() -> dict:
    env = dict(os.environ)
    env.update({"DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def finetune_cmd(*args) -> list[str]:
    return [sys.executable, str(ROOT / "finetune.py"), *map(str, args)]


def run(cmd, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=timeout, **kw)


def train_log(run_dir: Path) -> list[dict]:
    f = Path(run_dir) / "train_log.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
