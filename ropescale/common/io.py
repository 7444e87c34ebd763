"""Input/output conventions shared by every CLI: clear input errors, JSONL reading, atomic writes.

- Bad input raises :class:`InputError` naming ``file:line``; ``ropescale.common.cli.cli_main`` turns it into one line on
  stderr and exit code 2.
- Every output file is written to a temporary file in the same directory and renamed into place, so a reader
  never sees a half-written file. It gets the mode a plain ``open(path, "w")`` would give it (an existing file's
  mode, else ``0o666 & ~umask``; directories ``0o777 & ~umask``), not the 0600 / 0700 of ``tempfile``.
- The one output rule (:func:`claim_output_file`, :func:`claim_output_dir`): a command replaces only what it wrote.
  A file or directory a command writes at a user's path is listed, with its sha256 (a file) and the command, in
  ``.ropescale-outputs.json`` (:data:`OUTPUTS_RECORD`) beside it; an existing path that record does not name (or a
  file changed since) is refused in one line before any work, unless ``--overwrite``. A plot path must end in
  ``.png``. Run directories follow the same rule in ``ropescale.common.runs.resume.claim_run_dir`` (a non-empty
  directory that holds no run is refused).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


class InputError(Exception):
    """Bad user input. ``str(err)`` is one line: ``FILE:LINE: what is wrong`` (or ``FILE: ...``)."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        self.message = message
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = (), *, aliases: dict[str, str] | None = None,
               skip_bad: bool = False, on_skip: Callable[[InputError], None] | None = None) -> Iterator[dict]:
    """Yield one dict per non-empty line of a UTF-8 JSONL file.

    ``required`` names fields that must be present; ``aliases`` maps an accepted alternative name to the
    canonical one (e.g. ``{"summary": "reference"}``), applied before the check. Malformed JSON, non-UTF-8 bytes,
    a non-object line or a missing field raise :class:`InputError` with file and line, unless ``skip_bad`` is set,
    in which case ``on_skip(err)`` is called and the line is skipped.
    """
    path = Path(path)
    check_input_file(path)
    aliases = aliases or {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"not valid UTF-8 (byte {e.start})", path, lineno) from None
                if not text.strip():
                    continue
                try:  # without its line break, so an error at the end of the line is at its last column
                    obj = json.loads(text.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    raise json_error(e, path, lineno - 1) from None
                if not isinstance(obj, dict):
                    raise InputError(f"expected a JSON object, got {type(obj).__name__}", path, lineno)
                for alt, canon in aliases.items():
                    if canon not in obj and alt in obj:
                        obj[canon] = obj[alt]
                missing = [k for k in required if k not in obj]
                if missing:
                    raise InputError(f"missing field(s) {', '.join(map(repr, missing))}", path, lineno)
                obj.setdefault("_line", lineno)
                yield obj
            except InputError as err:
                if not skip_bad:
                    raise
                if on_skip is not None:
                    on_skip(err)


def json_error(e: json.JSONDecodeError, path: str | os.PathLike, line_offset: int = 0) -> InputError:
    """A JSON parse error as one line ``FILE:LINE: malformed JSON: what (column C)``: the line and column where the
    parser stopped (``line_offset`` is added for a text that starts further down a file)."""
    return InputError(f"malformed JSON: {e.msg} (column {e.colno})", path, e.lineno + line_offset)


def read_json(path: str | os.PathLike, what: str = "JSON", *, obj: bool = True) -> Any:
    """A JSON file's value: a missing file, non-UTF-8 bytes, malformed JSON (with line and column) or, with
    ``obj``, anything but a JSON object is an :class:`InputError` naming the file. ``what`` names the file's
    role in the messages (``config.json``, ``DeepSpeed config`` ...)."""
    path = check_input_file(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{what} is not valid UTF-8 (byte {e.start})", path) from None
    except json.JSONDecodeError as e:
        raise json_error(e, path) from None
    if obj and not isinstance(value, dict):
        raise InputError(f"{what}: expected a JSON object, got {type(value).__name__}", path)
    return value


def share_private_files(root: str | os.PathLike) -> int:
    """Give the files under ``root`` that a library wrote private (mode 0600: safetensors does, and HF's
    checkpoints through it) the mode a plain ``open()`` gives (``0o666 & ~umask``); other modes (executable
    scripts, a user's own choice) are left alone. Returns how many files changed."""
    fmode, n = default_file_mode(), 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with contextlib.suppress(OSError):
                if stat.S_IMODE(os.lstat(p).st_mode) == 0o600 and fmode != 0o600:
                    os.chmod(p, fmode)
                    n += 1
    return n


def check_input_file(path: str | os.PathLike) -> Path:
    """``path`` must be an existing regular file (a directory or a missing path is an :class:`InputError`)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory, expected a file", path)
    if not path.is_file():
        raise InputError("no such file", path)
    return path


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode(path: str | os.PathLike | None = None) -> int:
    """The mode ``open(path, "w")`` leaves a file with: an existing file keeps its mode, a new one gets
    ``0o666 & ~umask``."""
    if path is not None:
        try:
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                return stat.S_IMODE(st.st_mode)
        except OSError:
            pass
    return 0o666 & ~current_umask()


def default_dir_mode() -> int:
    """The mode ``os.mkdir(path)`` gives a new directory: ``0o777 & ~umask``."""
    return 0o777 & ~current_umask()


def _check_parents(path: Path, what: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{what}cannot be created: {parent} is not a directory", path)
            break


def writable_dir(d: Path) -> bool:
    """Whether this process may create files in directory ``d`` (``os.access`` W+X: it sees read-only mounts,
    immutable directories and missing permission, for root too)."""
    return os.access(d, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def _check_writable(path: Path, what: str, *, is_dir: bool) -> None:
    """Where ``path`` is written can be written: the directory itself when it exists (``is_dir``), else the
    nearest existing folder above it (every write is a new file renamed into place: :func:`atomic_open`)."""
    d = path if is_dir and path.is_dir() else next((p for p in path.parents if p.exists()), Path("."))
    if d.is_dir() and not writable_dir(d):
        where = "" if d == path else f" ({d} is not writable)"
        raise InputError(f"{what}cannot be written here{where}: a read-only file system or folder, or no permission; "
                         "choose another place", path)


def check_output_file(path: str | os.PathLike, what: str | None = None) -> Path:
    """``path`` may be written as a file: it is not an existing directory, no parent of it is a file, and the
    folder it goes in can be written (:func:`_check_writable`). ``what``
    (e.g. ``--out``) names the flag in the error."""
    path = Path(path)
    pre = f"{what}: " if what else ""
    if path.is_dir():
        raise InputError(f"{pre}output is an existing directory, expected a file path", path)
    _check_parents(path, pre or "the output ")
    _check_writable(path, pre, is_dir=False)
    return path


def check_output_dir(path: str | os.PathLike, what: str | None = None) -> Path:
    """``path`` may be written as a directory: it is not an existing file, no parent of it is a file, and it (or
    the folder it will be made in) can be written (:func:`_check_writable`). ``what``
    (e.g. ``--out``) names the flag in the error."""
    path = Path(path)
    pre = f"{what}: " if what else ""
    if path.exists() and not path.is_dir():
        raise InputError(f"output exists and is not a directory{f' ({what})' if what else ''}", path)
    _check_parents(path, pre or "the output directory ")
    _check_writable(path, pre, is_dir=True)
    return path


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temp file beside ``path``; on success fsync + rename it to ``path``, on error remove it. The file
    gets the mode ``open(path, "w")`` would give it (:func:`default_file_mode`)."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, default_file_mode(path))
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if _claimed_path(path):
        note_output(path)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
    """Build a directory in a temp dir beside ``path`` (yielded); on success give it (and the files in it) the
    modes a plain mkdir / open would, and swap it into place (an existing ``path`` is replaced only once the new
    one is complete); on error -- the final rename included -- remove the temp dir and leave ``path`` as it was.
    The one way every command writes a directory (packed sets, exports, merged models)."""
    path = check_output_dir(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        fmode, dmode = default_file_mode(), default_dir_mode()
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), dmode)
            for f in files:
                os.chmod(os.path.join(root, f), fmode)
        os.chmod(tmp, dmode)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            if old is not None:
                os.rename(old, path)  # the old directory back in place
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if _claimed_path(path):
        note_output(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False, default=str) + "\n")


# ---------------------------------------------------------------- the one output rule: replace only what we wrote
OUTPUTS_RECORD = ".ropescale-outputs.json"  # beside a command's outputs: {name: {"sha256"|"dir", "by", "at"}}
# what a command leaves in a folder besides its outputs, and a .gitignore of a work directory kept in the repository
SCAFFOLDING = (OUTPUTS_RECORD, ".lock", ".gitignore")
_claimed: set[str] = set()  # absolute paths this process claimed: recorded once written (atomic_open / atomic_dir)
_claimed_dirs: set[str] = set()  # folders whose files this process writes (a report's --out DIR)
writer_name = "ropescale"  # who the record says wrote an output (the Tool sets it to its command line)


def outputs_record(folder: str | os.PathLike) -> dict:
    """The outputs record of ``folder`` ({} when there is none or it cannot be read: nothing there is ours)."""
    try:
        rec = json.loads((Path(folder) / OUTPUTS_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def wrote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is what a command of this tool wrote there and nobody changed since (the record beside it
    names it; a file's sha256 still the recorded one)."""
    path = Path(path)
    entry = outputs_record(path.parent).get(path.name)
    if not isinstance(entry, dict):
        return False
    if path.is_dir() and not path.is_symlink():
        return entry.get("dir") is True
    return path.is_file() and entry.get("sha256") == sha256_file(path)


def note_output(path: str | os.PathLike) -> None:
    """Record ``path`` (a file or directory just written) in the outputs record beside it."""
    path = Path(path)
    rec = outputs_record(path.parent)
    entry = {"dir": True} if path.is_dir() else {"sha256": sha256_file(path)}
    rec[path.name] = {**entry, "by": writer_name, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        with atomic_open(path.parent / OUTPUTS_RECORD) as f:
            f.write(json.dumps(rec, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
    except OSError:  # the output is written; unrecorded it only counts as someone else's next time (refused)
        pass


def _claimed_path(path: Path) -> bool:
    if path.name == OUTPUTS_RECORD:
        return False
    return os.path.abspath(path) in _claimed or os.path.abspath(path.parent) in _claimed_dirs


def foreign_entries(d: str | os.PathLike) -> list[str]:
    """The names in directory ``d`` that no command of this tool wrote, sorted: its record and scaffolding, the
    temp files of an interrupted atomic write, recorded outputs, run directories (``run.json``) and folders of
    only such entries aside."""
    def ours(e: Path) -> bool:
        if e.name in SCAFFOLDING or (e.name.startswith(".") and ".tmp" in e.name) or wrote(e):
            return True
        return e.is_dir() and not e.is_symlink() and ((e / "run.json").is_file() or not foreign_entries(e))

    return sorted(e.name for e in Path(d).iterdir() if not ours(e))


def refuse_foreign(path: Path, what: str | None, why: str) -> InputError:
    flag = f"{what}: " if what else ""
    return InputError(f"{flag}{why}, not written by this tool: pass --overwrite to replace it, or choose a new "
                      "path", path)


def claim_output_file(path: str | os.PathLike, what: str | None = "--out", *, overwrite: bool = False,
                      suffix: str | None = None) -> Path:
    """``path`` may be written as this command's output file (:func:`check_output_file`), checked before any work:
    with ``suffix`` (``.png``) it ends so; an existing file is replaced only when this tool wrote it
    (:func:`wrote`) or with ``overwrite``. The file is recorded as ours once written."""
    path = check_output_file(path)
    if suffix and path.suffix.lower() != suffix:
        raise InputError(f"{what + ': ' if what else ''}must end in {suffix} (it is written as {suffix[1:].upper()})",
                         path)
    if (path.exists() or path.is_symlink()) and not overwrite and not wrote(path):
        raise refuse_foreign(path, what, "an existing file")
    _claimed.add(os.path.abspath(path))
    return path


def claim_output_dir(path: str | os.PathLike, what: str | None = "--out", *, overwrite: bool = False,
                     whole: bool = True) -> Path:
    """``path`` may be written as this command's output directory (:func:`check_output_dir`), checked before any
    work: new, empty, or holding only what this tool wrote; else only with ``overwrite``. ``whole``: the command
    writes the directory itself (:func:`atomic_dir`: recorded beside it); else the files it writes in it are
    recorded (a report's tables)."""
    path = check_output_dir(path)
    if path.is_dir() and not overwrite and not (whole and wrote(path)):
        foreign = foreign_entries(path)
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise refuse_foreign(path, what, f"a non-empty directory (it holds {foreign[0]}{more})")
    (_claimed if whole else _claimed_dirs).add(os.path.abspath(path))
    return path


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    with atomic_open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
