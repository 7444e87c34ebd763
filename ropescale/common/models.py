"""Where a model is: what every ``--model`` resolves to, checked before anything loads.

- ``tiny`` (the default of every command) is the embedded tiny default, committed in ``assets/tiny/``: its
  ``tiny.json`` records the sha256 of its weights, checked once per process (:func:`tiny_asset`). It is never
  built here: ``python -m ropescale make-tiny --build`` builds one (``ropescale.tiny``);
- an existing path is a Hugging Face model directory, checked for a config and whole weights
  (:func:`check_model_dir`, :func:`check_weights`: headers only, never the tensors) and for a config.json that is
  a model config (:func:`check_config`: a known ``model_type``, positive sizes, a positive ``rope_theta``); a
  ``.gguf`` file is the model directory it converts to once (``ropescale.common.gguf.cached_dir``, the file's
  header checked first: ``ropescale.common.gguf.check_gguf``);
- anything else is a Hugging Face Hub id only when it looks like one and the Hub has it (:func:`hub_id_or_none`,
  the rule :data:`MODEL_HELP` states); otherwise it is a model directory that is not there, one line saying how
  to download one into it (:func:`missing_model`). Decided here, before transformers would retry the network and
  end in a traceback.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from pathlib import Path

from .io import InputError, read_json, sha256_file
from .paths import REPO_ROOT

TINY_NAMES = ("tiny", "")  # what --model takes for the embedded tiny default
ASSET_DIR = REPO_ROOT / "assets" / "tiny"  # the committed build of ropescale.tiny.DEFAULT_SPEC
ASSET_JSON = "tiny.json"  # its record: the spec and its key, the sha256 of the weights, the build's metrics
MODEL_FILE = "model.safetensors"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
REBUILD = "python -m ropescale make-tiny --build --update-asset"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # OWNER/NAME: one slash, no ./ ../ / ~ prefix, no trailing /
MODELS_DIR = "models"  # where the README and the recipes put downloaded models
HUB_TIMEOUT_S = 5.0  # one look-up at the Hub; a network that is down answers at once, a black hole in 5 s
# The Hub ids of the models the recipes expect under models/ (the download hint names the right one)
HUB_IDS = {"Qwen1.5-7B": "Qwen/Qwen1.5-7B", "Yi-6B": "01-ai/Yi-6B", "Llama-3.1-8B": "meta-llama/Llama-3.1-8B"}
MODEL_HELP = ("'tiny' (the embedded default), a model directory, a GGUF file (converted once into .cache/gguf/), or "
              "a Hugging Face Hub id OWNER/NAME (how they are told apart: docs/usage.md)")
# The rule (docs/usage.md says it to users): a value that is not an existing directory is a Hub id only when it reads
# OWNER/NAME (one '/'; not ./ ../ / or ~ first, no trailing /; OWNER neither 'models' nor a folder here: models/X is
# a path) and the Hub has it (with HF_HUB_OFFLINE=1: the local Hugging Face cache has it); anything else is a missing
# directory.
# the sizes a model config must give as positive integers where it gives them (config_problem)
SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size",
             "num_key_value_heads", "head_dim", "max_position_embeddings")
_verified: set[tuple] = set()  # (path, size, mtime) of weights whose sha256 matched their record


def is_tiny(name: str | os.PathLike | None) -> bool:
    """Whether ``--model name`` means the embedded tiny default."""
    return name is None or str(name) in TINY_NAMES


def asset_info(d: str | os.PathLike | None = None) -> dict | None:
    """A tiny build's ``tiny.json`` (default: the committed asset's), or None when there is none."""
    p = Path(ASSET_DIR if d is None else d) / ASSET_JSON
    return read_json(p, ASSET_JSON) if p.is_file() else None


def verify_build(d: str | os.PathLike) -> Path:
    """``d`` when it is a whole tiny build: its ``tiny.json`` is there and its weights have the sha256 it records
    (checked once per process while the file is unchanged); an InputError saying how to restore it otherwise."""
    d = Path(d)
    info = asset_info(d)
    if info is None:
        raise InputError(f"the embedded tiny default is missing ({ASSET_JSON}): restore it (git checkout "
                         f"assets/tiny) or rebuild it: {REBUILD}", d)
    f = d / MODEL_FILE
    st = f.stat() if f.is_file() else None
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns) if st else None
    if key not in _verified:
        want = info["sha256"][MODEL_FILE]
        got = sha256_file(f) if st else "missing"
        if got != want:
            raise InputError(f"{MODEL_FILE} does not match the sha256 in {ASSET_JSON} ({got[:12]} vs {want[:12]}); "
                             f"restore it (git checkout assets/tiny) or rebuild: {REBUILD}", d)
        _verified.add(key)
    return d


def tiny_asset() -> Path:
    """The committed tiny default (``assets/tiny``), its weights checked against their recorded sha256."""
    return verify_build(ASSET_DIR)


def check_model_dir(path: str | os.PathLike) -> Path:
    """``path`` if it is an HF model directory with a config and weights; otherwise an InputError that says what
    the directory is instead (a finetune run to merge first, a folder without weights, not a folder)."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such model directory", p)
    if not p.is_dir():
        raise InputError("not a model directory (a file; pass the folder holding config.json)", p)
    run_json = p / "run.json"
    if run_json.is_file() or (p / "export.json").is_file() or (p / "final" / "export.json").is_file():
        kind = ""
        with contextlib.suppress(Exception):
            kind = json.loads(run_json.read_text(encoding="utf-8")).get("kind", "")
        if kind in ("", "finetune"):
            raise InputError("a finetune run directory, not a model: merge it first "
                             f"(python finetune.py merge --run {p} --out MODEL_DIR) and pass MODEL_DIR", p)
        raise InputError(f"a {kind} run directory, not a model directory", p)
    if not (p / "config.json").is_file():
        raise InputError("not a model directory (no config.json)", p)
    check_weights(p)
    return p


def check_weights(p: Path) -> None:
    """The weights of model directory ``p`` are there and whole: some weight file exists, every shard an index
    names exists, and every safetensors file has a readable header and at least the bytes that header promises
    (a copy cut short is one line here, not a traceback from the loader). Reads headers only, never the tensors."""
    if not any((p / w).is_file() for w in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        raise InputError(f"model directory without weights (none of {', '.join(WEIGHT_FILES)})", p)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        wmap = read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wmap, dict):
            raise InputError("safetensors index without a weight_map", index)
        missing = sorted({s for s in wmap.values() if not (p / str(s)).is_file()})
        if missing:
            raise InputError(f"missing weight shard(s) the index names: {', '.join(missing)}", index)
    for f in sorted(p.glob("*.safetensors")):
        _check_safetensors(f)


def _check_safetensors(f: Path) -> None:
    """safetensors layout: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
    data_offsets: [begin, end]}, optional __metadata__}), then the data; offsets are relative to the data start."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise InputError(f"not a whole safetensors file ({size} bytes; its header cannot be read): a truncated "
                             "or interrupted copy?", f)
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("not a safetensors file (its header is not JSON)", f) from None
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise InputError(f"truncated safetensors file: {size} of the {need} bytes its header describes (an "
                         "interrupted download or copy?)", f)


def key_line(text: str, key: str, value=None) -> int | None:
    """The line of ``text`` (a JSON file's) where ``"key": value`` first appears (``value`` as JSON writes it),
    else where ``"key":`` first does, or None."""
    pats = [rf'"{re.escape(key)}"\s*:\s*{re.escape(json.dumps(value))}\s*[,}}\n]'] if value is not None else []
    for pat in pats + [rf'"{re.escape(key)}"\s*:']:
        m = re.search(pat, text)
        if m:
            return text.count("\n", 0, m.start()) + 1
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def config_problem(cfg: dict) -> tuple[str, str | None, object] | None:
    """(what is wrong, the key it is at, its value) with a model config's content, or None: ``model_type`` a
    non-empty string; the sizes of :data:`SIZE_KEYS` (where present, also in a nested ``text_config``) positive
    integers whose heads divide (``hidden_size`` by ``num_attention_heads`` without ``head_dim``,
    ``num_attention_heads`` by ``num_key_value_heads``), as many ``layer_types`` as layers; every ``rope_theta``
    (top level, ``rope_parameters``, per layer type) a positive number. What transformers would otherwise end in a
    traceback on, at load or at the first forward."""
    mt = cfg.get("model_type")
    if mt is None:
        return "not a model config: no \"model_type\" (what transformers reads to pick the architecture)", None, None
    if not isinstance(mt, str) or not mt.strip():
        return f"\"model_type\" must be a non-empty string, got {json.dumps(mt)}", "model_type", mt
    for c in (cfg, cfg.get("text_config")):
        if not isinstance(c, dict):
            continue
        for k in SIZE_KEYS:
            v = c.get(k)
            if v is not None and not (_is_int(v) and v > 0):
                return f"\"{k}\" must be a positive integer, got {json.dumps(v)}", k, v
        h, heads, kv = c.get("hidden_size"), c.get("num_attention_heads"), c.get("num_key_value_heads")
        if h and heads and c.get("head_dim") is None and h % heads:
            return (f"\"hidden_size\" {h} is not a multiple of \"num_attention_heads\" {heads} (and no "
                    "\"head_dim\")"), "num_attention_heads", heads
        lt, n = c.get("layer_types"), c.get("num_hidden_layers")
        if isinstance(lt, list) and n and len(lt) != n:
            return f"\"layer_types\" lists {len(lt)} layers, \"num_hidden_layers\" says {n}", "num_hidden_layers", n
        if heads and kv and heads % kv:
            return (f"\"num_attention_heads\" {heads} is not a multiple of \"num_key_value_heads\" {kv}",
                    "num_key_value_heads", kv)
    for where, theta in rope_thetas(cfg):
        if not (_is_number(theta) and theta > 0):
            return f"\"rope_theta\" ({where}) must be a positive number, got {json.dumps(theta)}", "rope_theta", theta
    return None


def rope_thetas(cfg: dict) -> list[tuple[str, object]]:
    """Every ``rope_theta`` of a config dict: (where, value), at the top level (transformers 4.x), in
    ``rope_parameters`` (5.x) or in its per-layer-type entries, and in a nested ``text_config``."""
    out = []
    for prefix, c in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if not isinstance(c, dict):
            continue
        if "rope_theta" in c:
            out.append((f"{prefix}rope_theta", c["rope_theta"]))
        rp = c.get("rope_parameters")
        if isinstance(rp, dict):
            if "rope_theta" in rp:
                out.append((f"{prefix}rope_parameters", rp["rope_theta"]))
            out += [(f"{prefix}rope_parameters.{k}", v["rope_theta"]) for k, v in rp.items()
                    if isinstance(v, dict) and "rope_theta" in v]
    return out


def check_config(path: str | os.PathLike) -> dict:
    """The config dict of ``path`` (a model directory's ``config.json``) when it is a model config
    (:func:`config_problem`): otherwise one line naming the file, the line of the key and what is wrong; and an
    architecture transformers does not know is named too (checked last: it imports transformers)."""
    path = Path(path)
    cfg = read_json(path, "config.json")  # malformed JSON / not an object: one line with line and column
    bad = config_problem(cfg)
    if bad is None:
        bad = unknown_model_type(cfg["model_type"])
    if bad is not None:
        msg, key, value = bad
        line = key_line(path.read_text(encoding="utf-8"), key, value) if key else None
        raise InputError(msg, path, line)
    return cfg


def unknown_model_type(model_type: str) -> tuple[str, str, str] | None:
    """The problem with a ``model_type`` this transformers has no architecture for (its ``CONFIG_MAPPING_NAMES``),
    or None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return None
    import difflib

    near = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else " (a newer transformers may know it)"
    return (f"\"model_type\" {model_type!r} is not an architecture this transformers knows{hint}", "model_type",
            model_type)


def resolve_model(name_or_path: str | os.PathLike | None) -> Path:
    """``tiny``/None -> the committed tiny default (:func:`tiny_asset`; never built here); an existing path -> that
    HF model directory (checked: config + weights); a Hub id the Hub (or, offline, the local cache) has
    (:func:`hub_id_or_none`) -> that id, for transformers to load; anything else -> an InputError in one line
    (:func:`missing_model`)."""
    if is_tiny(name_or_path):
        return tiny_asset()
    p = Path(name_or_path)
    if p.is_file() and p.suffix.lower() == ".gguf":  # a GGUF file: its model directory, converted once
        from .gguf import cached_dir

        d = check_model_dir(cached_dir(p))
        check_config(d / "config.json")
        return d
    if p.exists():
        check_model_dir(p)
        check_config(p / "config.json")
        return p
    if looks_like_hub_id(name_or_path):
        return Path(hub_id_or_none(str(name_or_path)))
    raise missing_model(str(name_or_path))


def looks_like_hub_id(name: str | os.PathLike) -> bool:
    """``OWNER/NAME`` (one slash; no ``./``, ``../``, ``/`` or ``~`` first, no trailing ``/``) whose OWNER is
    neither ``models`` (the README's layout: ``models/X`` is always a path) nor a folder in the current directory."""
    s = str(name)
    owner = s.split("/", 1)[0]
    return bool(_HUB_ID.match(s)) and owner != MODELS_DIR and not Path(owner).is_dir()


def hf_offline() -> bool:
    """HF's own offline switch, read now (``HF_HUB_OFFLINE``, or transformers' ``TRANSFORMERS_OFFLINE``)."""
    v = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return v.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_id_or_none(name: str) -> str:
    """``name`` when the Hub can give it: with HF_HUB_OFFLINE=1 its config is in the local HF cache; online one
    look-up at the Hub (:data:`HUB_TIMEOUT_S`). Otherwise an InputError in one line (:func:`missing_model`)."""
    if hf_offline():
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return name
        raise missing_model(name, "nor in the local Hugging Face cache (HF_HUB_OFFLINE=1)")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise missing_model(name, "nor a model on the Hugging Face Hub (a private one needs: hf auth login)") \
            from None
    except Exception as e:  # no network, a proxy, a time-out, a server error: the Hub cannot tell
        why = f"and the Hugging Face Hub is not reachable to look it up ({type(e).__name__})"
        raise missing_model(name, why) from None
    return name


def missing_model(name: str, why: str = "") -> InputError:
    """The one line for a ``--model`` that is neither here nor on the Hub, with the download that fills it: into
    the path given (a Hub id: into ``models/NAME``, the README's layout), from the Hub id of a recipe's model
    (:data:`HUB_IDS`) or the id given."""
    name = name.rstrip("/") or name
    base = Path(name).name
    hub_shaped = looks_like_hub_id(name)
    local = f"{MODELS_DIR}/{base}" if hub_shaped else name
    repo = HUB_IDS.get(base, name if hub_shaped else "OWNER/NAME")
    then = f", then pass --model {local}" if hub_shaped else ""
    return InputError(f"no such model directory{', ' + why if why else ''} (download it with: hf download {repo} "
                      f"--local-dir {local}{then})", name)
