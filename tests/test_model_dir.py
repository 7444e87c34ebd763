"""resolve_model / check_model_dir: every wrong --model is one clear line (issue 15), hub ids pass through."""
import json
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.models import check_model_dir, resolve_model


def test_model_dir_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match="without weights"):
        resolve_model(tmp_path)


def test_finetune_run_dir_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "run.json").write_text(json.dumps({"kind": "finetune"}))
    with pytest.raises(InputError, match="finetune run directory.*merge"):
        resolve_model(tmp_path)


def test_no_config_and_file_and_missing(tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        check_model_dir(tmp_path)
    f = tmp_path / "x.bin"
    f.write_bytes(b"")
    with pytest.raises(InputError, match="a file"):
        check_model_dir(f)
    with pytest.raises(InputError, match="no such model directory"):
        resolve_model(tmp_path / "nope")


def test_hub_id_passes_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(resolve_model("Qwen/Qwen1.5-7B")) == "Qwen/Qwen1.5-7B"


def test_model_dir_with_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    assert check_model_dir(tmp_path) == Path(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # an empty (interrupted) file is not weights
    with pytest.raises(InputError, match="not a whole safetensors file"):
        check_model_dir(tmp_path)
