"""Broken model files are one line (issue 48, part 3): a config.json that is valid JSON but not a model config, a
file that is not GGUF and a GGUF cut short each end every command of the CLI registry that takes ``--model``
(eval generate / run, finetune train, rope search, every probe) and ``rope describe --config`` (the GGUF files) with
exit 2 and one line naming the file and what is wrong, before anything heavy loads. Before: 28-60-line tracebacks
with exit 1 (ValueError "Unrecognized model", TypeError "Field 'hidden_size' expected int", RuntimeError "negative
dimension", IndexError at the first forward, gguf's "cannot reshape array")."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.models import ASSET_DIR, check_config, resolve_model

ROOT = Path(__file__).resolve().parent.parent


def _set(*keys, value):
    def edit(c):
        d = c
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


# variant -> (how config.json is broken, the key its message names, the words of the message)
CONFIGS = {
    "no_model_type": (lambda c: c.pop("model_type"), None, 'no "model_type"'),
    "model_type_number": (_set("model_type", value=7), "model_type", '"model_type" must be a non-empty string'),
    "unknown_model_type": (_set("model_type", value="qwen9"), "model_type", "not an architecture this transformers"),
    "hidden_str": (_set("hidden_size", value="big"), "hidden_size", '"hidden_size" must be a positive integer'),
    "hidden_zero": (_set("hidden_size", value=0), "hidden_size", '"hidden_size" must be a positive integer, got 0'),
    "heads_neg": (_set("num_attention_heads", value=-4), "num_attention_heads", "got -4"),
    "heads_float": (_set("num_attention_heads", value=4.0), "num_attention_heads", "got 4.0"),
    "heads_not_dividing": (_set("num_attention_heads", value=3), "num_attention_heads", "not a multiple"),
    "layers_zero": (_set("num_hidden_layers", value=0), "num_hidden_layers", '"num_hidden_layers" must be a positive'),
    "layers_vs_types": (_set("num_hidden_layers", value=2), "num_hidden_layers", '"layer_types" lists 4 layers'),
    "vocab_zero": (_set("vocab_size", value=0), "vocab_size", '"vocab_size" must be a positive integer, got 0'),
    "theta_neg": (_set("rope_parameters", "rope_theta", value=-1.0), "rope_theta", '"rope_theta" (rope_parameters) '
                                                                                   "must be a positive number"),
    "theta_str": (_set("rope_parameters", "rope_theta", value="ten"), "rope_theta", 'got "ten"'),
    "theta_top_level": (_set("rope_theta", value=0), "rope_theta", '"rope_theta" (rope_theta) must be a positive'),
}


def _changed_line(before: str, after: str) -> int:
    """The first line of ``after`` (a pretty-printed JSON text) that ``before`` does not hold, trailing commas
    aside: where the edit is, found here independently of the code under test."""
    old = {ln.strip().rstrip(",") for ln in before.splitlines()}
    return next(i for i, ln in enumerate(after.splitlines(), 1) if ln.strip().rstrip(",") not in old)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict:
    """Each broken variant as a model directory built from the committed tiny model (weights linked, config.json
    edited and pretty-printed), plus the two bad GGUF files; name -> path."""
    root = tmp_path_factory.mktemp("broken")
    out = {}
    for name, (edit, _, _) in CONFIGS.items():
        d = root / name
        d.mkdir()
        for f in ASSET_DIR.iterdir():
            if f.name not in ("config.json", "tiny.json"):
                (d / f.name).symlink_to(f)
        cfg = json.loads((ASSET_DIR / "config.json").read_text(encoding="utf-8"))
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        out[name] = d
    whole = root / "whole.gguf"
    _write_gguf(whole)
    data = whole.read_bytes()
    (root / "not.gguf").write_bytes(b"<html>404 not found</html>\n" * 8)  # a download that went wrong
    (root / "cut_data.gguf").write_bytes(data[:len(data) - 100])  # cut inside the tensor data
    (root / "cut_header.gguf").write_bytes(data[:60])  # cut inside the metadata
    out.update(whole=whole, **{n: root / f"{n}.gguf" for n in ("not", "cut_data", "cut_header")})
    return out


def _write_gguf(path: Path) -> None:
    """A small valid GGUF file written by the gguf package (two f32 tensors, some metadata)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GGUF_WANT = {"not": "not a GGUF file (it starts with b'<htm'", "cut_data": "truncated GGUF file: ",
             "cut_header": "truncated GGUF file: its header is cut short"}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_check_config_names_file_line_and_what(broken, name):
    _, key, words = CONFIGS[name]
    path = broken[name] / "config.json"
    with pytest.raises(InputError) as e:
        check_config(path)
    msg = str(e.value)
    original = json.dumps(json.loads((ASSET_DIR / "config.json").read_text(encoding="utf-8")), indent=2)
    line = _changed_line(original, path.read_text(encoding="utf-8")) if key else None
    where = f"{path}:{line}: " if line else f"{path}: "
    assert msg.startswith(where) and words in msg and "\n" not in msg, msg


def test_the_committed_and_a_tiny_config_pass(make_tiny_model):
    """A good config is left alone: the committed tiny default and a freshly built tiny model (another arch)."""
    assert check_config(ASSET_DIR / "config.json")["model_type"] == "qwen2"
    _, d = make_tiny_model(orig_ctx=64, seed=1)
    assert resolve_model(d) == Path(d)


def test_gguf_header_against_the_gguf_package(broken):
    """check_gguf's byte count for a whole file equals the end of its last tensor as the gguf package's own reader
    places it (an independent parser); each broken file is refused with its reason."""
    from gguf import GGUFReader

    from ropescale.common.gguf import check_gguf

    f = broken["whole"]
    r = GGUFReader(str(f))
    end = max(t.data_offset + t.n_bytes for t in r.tensors)
    info = check_gguf(f)
    assert (info["need"], info["tensors"], info["version"]) == (end, len(r.tensors), 3)
    assert end == f.stat().st_size
    for name, words in GGUF_WANT.items():
        with pytest.raises(InputError) as e:
            check_gguf(broken[name])
        assert str(e.value).startswith(f"{broken[name]}: {words}"), str(e.value)
    with pytest.raises(InputError, match=f"{f.stat().st_size - 100} of the {end} bytes"):
        check_gguf(broken["cut_data"])


def test_a_whole_gguf_that_is_no_model(broken, tmp_path):
    """A whole GGUF file whose tensors make no model transformers can build: one line, nothing written."""
    from ropescale.common.gguf import convert

    with pytest.raises(InputError) as e:
        convert(broken["whole"], tmp_path / "out")
    assert str(e.value).startswith(f"{broken['whole']}: a GGUF file transformers cannot read as a model (")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


# what each command that takes --model needs beside it to get as far as reading the model (DATA, OUT: filled in)
EXTRA = {
    ("eval", "generate"): ["--data", "DATA", "--prompt", "ie", "--max-new-tokens", "5", "--out", "OUT"],
    ("eval", "run"): ["--data", "DATA", "--prompt", "ie", "--max-new-tokens", "5", "--out", "OUT"],
    ("finetune", "train"): ["--out", "OUT", "--max-steps", "1"],
    ("rope", "search"): ["--out", "OUT", "--evals", "2", "--scale", "2"],
    **{("probes", p): ["--out", "OUT"] for p in ("suffix-id", "ppl", "perturb", "copy", "shuffle", "ruler",
                                                  "passkey", "position-loss", "continuation")},
    ("rope", "describe"): [],
}
# every command is driven (describe reads config.json through ropescale.common.models.check_config too)
PENDING: set = set()


def model_commands() -> list[tuple[str, str]]:
    """Every command of the CLI registry (ropescale.cli.TOOLS) that takes --model: a new one is driven here on
    arrival (or this fails until EXTRA says what it needs)."""
    from ropescale.cli import TOOLS, tool
    from ropescale.common.cli import _commands

    out = []
    for name in TOOLS:
        t = tool(name)
        ap = t.parser(f"ropescale {name}")
        for cmd, p in ({"": ap} if t.single else _commands(ap)).items():
            if any("--model" in a.option_strings for a in p._actions):
                out.append((name, cmd))
    return out


def test_every_model_command_is_driven():
    cmds = set(model_commands())
    assert cmds - PENDING == set(EXTRA), "a command takes --model: say in EXTRA what else it needs"


def _argv(key, model: Path, tmp: Path) -> list[str]:
    data = tmp / "eval.jsonl"
    data.write_text(json.dumps({"context": "some text", "summary": "a summary"}) + "\n", encoding="utf-8")
    out = str(tmp / "-".join(key))
    extra = [{"DATA": str(data), "OUT": out}.get(a, a) for a in EXTRA[key]]
    return [key[0], *([key[1]] if key[1] else []), "--model", str(model), *extra]


def _one_line(capsys, argv: list[str], main=None) -> str:
    from ropescale.cli import main as ropescale_main

    rc = (main or ropescale_main)(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, (rc, err[-2000:])
    return err


@pytest.mark.parametrize("name", list(CONFIGS) + list(GGUF_WANT))
def test_every_command_refuses_in_one_line(broken, name, tmp_path, capsys):
    """Every command that takes --model on each broken variant: exit 2, one line naming the file, nothing
    written."""
    model = broken[name]
    named = str(model if name in GGUF_WANT else model / "config.json")
    for key in EXTRA:
        err = _one_line(capsys, _argv(key, model, tmp_path))
        assert err.startswith(f"error: {named}:"), (key, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl"]


@pytest.mark.parametrize("name", list(GGUF_WANT))
def test_describe_refuses_a_bad_gguf_in_one_line(broken, name, capsys):
    err = _one_line(capsys, ["rope", "describe", "--config", str(broken[name])])
    assert err.startswith(f"error: {broken[name]}: {GGUF_WANT[name]}"), err


def test_the_real_entry_point(broken, tmp_path):
    """One subprocess through the installed entry (``python -m ropescale probes ppl``): exit 2, one stderr line."""
    d = broken["no_model_type"]
    r = subprocess.run([sys.executable, "-m", "ropescale", "probes", "ppl", "--model", str(d), "--out",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == f"error: {d / 'config.json'}: not a model config: no \"model_type\" (what " \
                               "transformers reads to pick the architecture)", r.stderr[-2000:]
    assert not (tmp_path / "out").exists()
