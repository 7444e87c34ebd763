"""ropescale.common.io: atomically written files get the modes a plain open()/mkdir would give (not tempfile's
0600/0700), and a directory or file where the other kind is expected is a clear InputError (issue 15)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ropescale.common.io import (
    InputError,
    atomic_dir,
    atomic_open,
    check_output_dir,
    check_output_file,
    read_jsonl,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)
from ropescale.common.runs.record import RecordLog, RunDir, find_run_dirs


@pytest.fixture
def umask():
    """Set the process umask for one test (and put the old one back)."""
    old = os.umask(0o022)

    def set_(mask: int) -> None:
        os.umask(mask)

    yield set_
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_atomic_files_get_the_mode_open_would_give(tmp_path, umask):
    umask(0o022)
    write_json_atomic(tmp_path / "run.json", {"a": 1})
    write_text_atomic(tmp_path / "table.md", "x\n")
    write_jsonl_atomic(tmp_path / "sub" / "pairs.jsonl", [{"a": 1}])
    with atomic_open(tmp_path / "fig.png", "wb") as f:
        f.write(b"\x89PNG")
    with open(tmp_path / "plain.txt", "w") as f:  # the reference: what open() gives
        f.write("x")
    for name in ("run.json", "table.md", "sub/pairs.jsonl", "fig.png", "plain.txt"):
        assert _mode(tmp_path / name) == 0o644, name
    umask(0o027)
    write_json_atomic(tmp_path / "other.json", {})
    assert _mode(tmp_path / "other.json") == 0o640
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_rewriting_keeps_an_existing_files_mode(tmp_path, umask):
    umask(0o022)
    p = tmp_path / "scores.json"
    p.write_text("{}")
    os.chmod(p, 0o640)
    write_json_atomic(p, {"b": 2})
    assert _mode(p) == 0o640 and json.loads(p.read_text()) == {"b": 2}


def test_atomic_dir_modes_replace_and_failure(tmp_path, umask):
    umask(0o022)
    out = tmp_path / "packed"
    with atomic_dir(out) as tmp:
        (tmp / "train.parquet").write_bytes(b"1")
        write_json_atomic(tmp / "meta.json", {})
        (tmp / "nested").mkdir()
    assert _mode(out) == 0o755 and _mode(out / "nested") == 0o755
    assert _mode(out / "train.parquet") == 0o644 and _mode(out / "meta.json") == 0o644
    with atomic_dir(out) as tmp:  # an existing OUT is replaced whole
        (tmp / "new.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["new.json"]
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("boom")
    assert sorted(p.name for p in out.iterdir()) == ["new.json"]  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed"]  # no temp dir left


def test_record_log_appends_with_open_mode(tmp_path, umask):
    umask(0o002)
    log = RecordLog(tmp_path / "items.jsonl")
    log.append({"id": "a"})
    assert _mode(tmp_path / "items.jsonl") == 0o664


def test_directory_given_as_a_file_and_file_as_a_directory(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    f = tmp_path / "f.jsonl"
    f.write_text('{"a": 1}\n')
    with pytest.raises(InputError, match=r"d: is a directory, expected a file"):
        list(read_jsonl(d))
    with pytest.raises(InputError, match="no such file"):
        list(read_jsonl(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="output is an existing directory"):
        write_json_atomic(d, {})
    with pytest.raises(InputError, match="output is an existing directory"):
        check_output_file(d)
    with pytest.raises(InputError, match="is not a directory"):
        write_json_atomic(f / "x.json", {})  # a parent is a file
    with pytest.raises(InputError, match="output exists and is not a directory"):
        check_output_dir(f)
    with pytest.raises(InputError, match="output exists and is not a directory"):
        with atomic_dir(f):
            pass
    with pytest.raises(InputError, match="is not a directory"):
        check_output_dir(f / "sub")
    assert f.read_text() == '{"a": 1}\n' and list(d.iterdir()) == []
    with pytest.raises(InputError, match="is a directory"):
        RecordLog(d)
    with pytest.raises(InputError, match="is a file, expected a run directory"):
        list(find_run_dirs([f]))
    with pytest.raises(InputError, match="not a run directory"):
        RunDir(d).read_meta()
