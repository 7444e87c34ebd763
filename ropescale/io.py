"""Input/output conventions shared by every CLI: clear input errors, JSONL reading, atomic writes.

- Bad input raises :class:`InputError` naming ``file:line``; :func:`cli_main` turns it into one line on stderr
  and exit code 2.
- Every output file is written to a temporary file in the same directory and renamed into place, so a reader
  never sees a half-written file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
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
    if not path.is_file():
        raise InputError("no such file", path)
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
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise InputError(f"malformed JSON: {e.msg} (column {e.colno})", path, lineno) from None
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


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temp file beside ``path``; on success fsync + rename it to ``path``, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False, default=str) + "\n")


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


def cli_main(fn: Callable[[list[str] | None], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI ``main(argv)``: InputError -> one line on stderr and exit code 2."""

    def wrapped(argv: list[str] | None = None) -> int:
        try:
            rc = fn(argv)
            return 0 if rc is None else int(rc)
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    wrapped.__doc__ = fn.__doc__
    wrapped.__name__ = getattr(fn, "__name__", "main")
    return wrapped


def module_subcommands(prog: str, description: str, modules: Iterable[str], metavar: str = "COMMAND"):
    """An argparse parser with one subcommand per module (in --help order); each module's ``register(subparsers)``
    adds its subparser and sets ``func`` (parsed args -> exit code). Run it with :func:`run_subcommand`."""
    import argparse
    import importlib

    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar=metavar)
    for name in modules:
        importlib.import_module(name).register(sub)
    return ap


def run_subcommand(ap, argv: list[str] | None) -> int:
    """Parse ``argv`` with a :func:`module_subcommands` parser and call the chosen subcommand (no subcommand:
    help on stderr, exit 2)."""
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return 2
    return args.func(args)
