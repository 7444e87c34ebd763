"""The one command-line style of every ropescale tool.

- A tool is a set of subcommands, one module each: the module's ``register(subparsers)`` adds its parser with
  :func:`add_command` and sets ``func``, its handler ``cmd_<name>(args) -> exit code``. :class:`Tool` takes those
  ``register`` functions themselves (a reader follows them from the tool to its commands), builds the parser and
  its ``main(argv)`` (the entry point) parses and runs; a tool may name a default subcommand
  (``finetune.py [train] FLAGS``) or be one command (``single``: ``ropescale make-tiny``, ``rope_scaling
  describe``), registered the same way.
- One look: choices print as ``{a,b}`` (:func:`~ropescale.common.settings.choices_metavar`), required flags show
  as required in the usage, and a missing one is argparse's ``error: the following arguments are required: --x``
  with exit code 2, whether argparse or a stage's settings (a recipe may give them) find it missing; ``--dtype``
  takes one vocabulary (:data:`DTYPES`, :func:`add_dtype`).
- The same names for the same ideas (:func:`add_out`, :func:`add_json`, :func:`add_format`): ``--out`` for what a
  command writes, ``--json`` wherever it prints a result, ``--format markdown|csv|json`` for tables.
- Help in plain words: module docstrings lose their reST markup, each default is shown once; a command's help fits
  on 100 lines (the rest of its manual is in docs/usage.md, :func:`doc_sections`).
- A misspelt flag, subcommand or choice is refused with the command's own usage and a "did you mean" (:class:`Parser`).
- ``--resume auto|never`` means the same in every stage that writes a run directory (:func:`add_resume`).
- Results go to stdout, progress and logs to stderr (``process.prepare_process`` also sends DeepSpeed's and
  transformers' loggers there, filters library warnings nobody here can act on and sets the CUDA allocator); bad
  input is one ``error: FILE:LINE: ...`` line and exit code 2 (:func:`cli_main`).
"""
from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import sys
from typing import Callable, Iterable

from .io import InputError
from .settings import MissingSettings, choices_metavar, plain
from .tables import FORMATS

FORMAT_ALIASES = {"md": "markdown"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks (examples), option help is wrapped."""

    def __init__(self, prog, **kw):
        kw.setdefault("max_help_position", 30)
        super().__init__(prog, **kw)

    def add_usage(self, usage, actions, groups, prefix=None):
        # a stage's required settings may come from its recipe, so argparse does not enforce them; the usage shows
        # them required all the same (settings.add_arguments marks them)
        actions = [_required_copy(a) if getattr(a, "shown_required", False) else a for a in actions]
        super().add_usage(usage, actions, groups, prefix)


class Parser(argparse.ArgumentParser):
    """argparse's parser with a "did you mean" for a misspelt flag, subcommand or choice (difflib's closest known
    spelling), ``unrecognized arguments`` reported with the usage of the command that was given them, and a
    ``--help`` that lists the flags of its ``advanced: ...`` groups by name only (``--help-all`` explains them), so
    it fits on a screen or two."""

    help_all = False

    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)  # --max-step is not --max-steps: a prefix is refused, with a did-you-mean
        super().__init__(*args, **kw)

    def error(self, message: str):
        super().error(message + did_you_mean(self, message))

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras and getattr(ns, "_leaf", None) is not None and ns._leaf is not self:
            ns._leaf.error(f"unrecognized arguments: {' '.join(extras)}")  # the subcommand's usage, not its parent's
        return ns, extras

    def format_help(self) -> str:
        advanced = [g for g in self._action_groups if _is_advanced(g)]
        if self.help_all or not advanced:
            return super().format_help()
        fmt = self._get_formatter()
        fmt.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        fmt.add_text(self.description)
        for g in self._action_groups:
            fmt.start_section(g.title)
            if g in advanced:
                fmt.add_text(_flag_list(g, fmt._width))
            else:
                fmt.add_text(g.description)
                fmt.add_arguments(g._group_actions)
            fmt.end_section()
        fmt.add_text(self.epilog)
        fmt.add_text(f"The flags of the advanced groups, explained: {self.prog} --help-all")
        return fmt.format_help()


def _is_advanced(g) -> bool:
    return (g.title or "").startswith("advanced") and any(a.help != argparse.SUPPRESS for a in g._group_actions)


def _flag_list(g, width: int) -> str:
    """An advanced group's flags by name (with their metavar), wrapped: what ``--help`` shows of it."""
    import textwrap

    parts = [next(o for o in a.option_strings if o.startswith("--")) for a in g._group_actions
             if a.help != argparse.SUPPRESS and a.option_strings]
    return textwrap.fill("  ".join(parts), width=max(width - 2, 40), initial_indent="  ", subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)


class _HelpAll(argparse.Action):
    """``--help-all``: the whole help, every flag explained."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.help_all = True
        parser.print_help()
        parser.exit()


def _flags(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions if a.help != argparse.SUPPRESS  # argparse has no public accessor for its actions
            for o in a.option_strings if o.startswith("--")]


def did_you_mean(p: argparse.ArgumentParser, message: str) -> str:
    """`` (did you mean --limit?)`` for an argparse error about an unknown flag, command or choice; '' when
    nothing known is close."""
    if message.startswith("unrecognized arguments:"):
        words = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("-")]
        known = _flags(p)
        close = {w: m[0] for w in words if (m := difflib.get_close_matches(w, known, n=1, cutoff=0.6))}
        if len(close) == 1:
            return f" (did you mean {next(iter(close.values()))}?)"
        return f" (did you mean {', '.join(f'{m} for {w}' for w, m in close.items())}?)" if close else ""
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message) or \
        re.search(r"expected one of (.*), got '([^']*)'", message)
    if not m:
        return ""
    got, choices = (m.group(1), m.group(2)) if "invalid choice" in m.group(0) else (m.group(2), m.group(1))
    known = [c.strip().strip("'") for c in choices.split(",")]
    close = difflib.get_close_matches(got, known, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _required_copy(action: argparse.Action) -> argparse.Action:
    a = copy.copy(action)
    a.required = True
    return a


def cli_main(fn: Callable[[list[str] | None], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI ``main(argv)``: InputError -> one line on stderr and exit code 2."""

    def wrapped(argv: list[str] | None = None, *args, **kw) -> int:
        try:
            rc = fn(argv, *args, **kw)
            return 0 if rc is None else int(rc)
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"interrupted{': ' + _on_interrupt[0] if _on_interrupt else ''}", file=sys.stderr)
            return 130
        finally:
            runs = sys.modules.get("ropescale.common.runs.locks")  # (not imported for a --help)
            if runs is not None:
                runs.release_run_dirs()  # the command is over: its run directories are free again

    wrapped.__doc__ = fn.__doc__
    wrapped.__name__ = getattr(fn, "__name__", "main")
    return wrapped


_on_interrupt: list[str] = []  # what cli_main says after "interrupted" (when_interrupted)


def when_interrupted(how: str) -> None:
    """Ctrl-C from now on prints ``interrupted: HOW`` (how to continue: :func:`rerun_command`)."""
    _on_interrupt[:] = [how]


LAUNCHERS = ("deepspeed", "torchrun")  # launchers whose command line a rerun hint gives (not their child's)


def launcher_command(pid: int | None = None) -> list[str] | None:
    """The launcher's command line up to the script it runs (``.venv/bin/deepspeed -q``), read from /proc, when this
    process runs under one (DeepSpeed's passes ``--local_rank``, torchrun sets ``TORCHELASTIC_RUN_ID``); None
    otherwise."""
    if not (any(a.startswith(("--local_rank", "--local-rank")) for a in sys.argv[1:])
            or "TORCHELASTIC_RUN_ID" in os.environ):
        return None
    pid = os.getppid() if pid is None else pid
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    for _ in range(4):  # the runner, then launch.py, then this process: a few levels up at most
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        names = [os.path.basename(a) for a in argv[:2]]
        if any(n in LAUNCHERS for n in names):
            head = argv[names.index(next(n for n in names if n in LAUNCHERS)):]
            cut = next((i for i, a in enumerate(head) if os.path.basename(a) == script), len(head))
            return head[:cut]
        pid = ppid
    return None


def rerun_command(add: Iterable[str] = (), drop: Iterable[str] = ()) -> str:
    """The command line this process was started with, as typed (``python -m PKG`` for a package's __main__, a
    path in the current folder relative to it; under a launcher, the launcher's command without the
    ``--local_rank`` it adds), without the flags in ``drop`` and with ``add`` appended when not there already."""
    import shlex

    argv = list(sys.argv)
    launcher = launcher_command()
    if launcher is not None:
        argv = [a for a in argv if not a.startswith(("--local_rank=", "--local-rank="))]
    first = argv[0] if argv else "python"
    if os.path.isabs(first) and not os.path.relpath(first).startswith(".."):
        first = os.path.relpath(first)  # as typed in the project folder
    if first.endswith("__main__.py"):
        head = ["python", "-m", os.path.basename(os.path.dirname(first))]
    else:  # a script, or a command such as .venv/bin/ropescale
        head = ["python", first] if first.endswith(".py") else [first]
    if launcher is not None:
        head = launcher + [os.path.relpath(first) if os.path.isabs(first) else first]
    drop = set(drop)
    rest = [a for a in argv[1:] if a not in drop]
    add = list(add)
    if add and add[0] not in rest:
        rest += add
    return shlex.join(head + rest)


def add_command(subparsers, name: str, *, help: str, description: str | None = None, epilog: str | None = None,
                aliases: Iterable[str] = ()) -> argparse.ArgumentParser:
    """A subcommand parser in the common style (plain-text description, the common formatter)."""
    return subparsers.add_parser(name, help=help, description=plain(description or help),
                                 epilog=plain(epilog) if epilog else None, formatter_class=HelpFormatter,
                                 aliases=list(aliases))


def _mark_leaf(p: argparse.ArgumentParser) -> None:
    """The parsed namespace names the (sub)command parser that read it: its usage goes with an unknown flag."""
    p.set_defaults(_leaf=p)


class _OneCommand:
    """What a module's ``register`` sees for a one-command tool: its ``add_parser`` gives the tool's own parser."""

    def __init__(self, prog: str):
        self.prog, self.parser = prog, None

    def add_parser(self, name: str, *, help: str | None = None, aliases=(), **kw) -> argparse.ArgumentParser:
        self.parser = Parser(prog=self.prog, **kw)
        return self.parser


def _commands(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in ap._actions:  # argparse has no public accessor for its subparsers
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def doc_sections(doc: str, head: int = 2, more: str | None = None) -> dict[str, str | None]:
    """``add_command``'s description and epilog from a module doc: its first ``head`` paragraphs (what the command
    does, how it is called) before the flags; after them the rest, or with ``more`` (a page of docs/, where the rest
    is written for users) one line naming that page, so a --help fits on 100 lines."""
    parts = doc.strip().split("\n\n")
    rest = f"More: {more}" if more and parts[head:] else "\n\n".join(parts[head:]) or None
    return {"description": "\n\n".join(parts[:head]), "epilog": rest}


class Tool:
    """A command with subcommands, or one command (``single``), see module doc; ``Tool(...).main(argv)`` parses
    and runs it."""

    def __init__(self, prog: str, description: str, commands: Iterable[Callable], *,
                 default: str | None = None, single: bool = False):
        self.prog, self.description, self.commands, self.default = prog, description, tuple(commands), default
        self.single = single
        if single and (len(self.commands) != 1 or default):
            raise ValueError("a single-command tool registers exactly one command and has no default")

    def parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        if self.single:
            one = _OneCommand(self.prog_name(prog))
            self.commands[0](one)
            _plain_parser(one.parser)
            return one.parser
        desc = plain(self.description)
        if self.default:
            desc += f"\n\nWithout a command, {self.default!r} runs: {self.prog_name(prog)} [{self.default}] FLAGS."
        ap = Parser(prog=prog or self.prog, description=desc, formatter_class=HelpFormatter)
        sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=Parser)
        for register in self.commands:
            register(sub)
        for sp in sub.choices.values():  # one style, whatever a module's register wrote
            _plain_parser(sp)
            _mark_leaf(sp)
        if self.default:
            self._default_help(sub, prog)
        return ap

    def _default_help(self, sub, prog: str | None) -> None:
        """The default command's help is the tool's: the tool's description (its examples) above the command's
        flags, the other commands listed below them (``finetune.py --help`` shows the training flags)."""
        sp = sub.choices[self.default]
        helps = {a.dest: a.help for a in sub._choices_actions}  # argparse has no public accessor for them
        others = [f"  {self.prog_name(prog)} {n} --help    {helps.get(n) or ''}".rstrip()
                  for n in sub.choices if n != self.default]
        sp.description = plain(self.description) + (f"\n\n{sp.description}" if sp.description else "")
        if others:
            note = "other commands:\n" + "\n".join(others)
            sp.epilog = f"{sp.epilog}\n\n{note}" if sp.epilog else note

    def prog_name(self, prog: str | None) -> str:
        return prog or self.prog

    def names(self, ap: argparse.ArgumentParser) -> set[str]:
        return set(_commands(ap))

    def entry(self) -> Callable[..., int]:
        """``main(argv=None, prog=None)`` for the tool's entry script: parse, run, bad input as one line + exit 2."""
        return cli_main(self.main)

    def main(self, argv: list[str] | None = None, prog: str | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        ap = self.parser(prog)
        if self.default:
            if argv[:1] in (["-h"], ["--help"]):  # the tool's help is its default command's, named as called
                sp = _commands(ap)[self.default]
                sp.prog, sp.usage = f"{self.prog_name(prog)} [{self.default}]", None
                _short_usage(sp)
            argv = _with_default(argv, self.default, self.names(ap))
        args = ap.parse_args(argv)
        from . import io

        io.writer_name = " ".join(x for x in (self.prog_name(prog), getattr(args, "command", None)) if x)
        if not getattr(args, "func", None):
            ap.print_help(sys.stderr)
            return 2
        try:
            return args.func(args)
        except MissingSettings as err:  # a required setting neither a flag nor the recipe gave: argparse's error
            (ap if self.single else _commands(ap)[args.command]).error(err.message)


def _plain_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = HelpFormatter
    if any(_is_advanced(g) for g in p._action_groups) and "--help-all" not in p._option_string_actions:
        p.add_argument("--help-all", action=_HelpAll, help=argparse.SUPPRESS)  # named at the end of --help
    p.description = plain(p.description) if p.description else p.description
    p.epilog = plain(p.epilog) if p.epilog else p.epilog
    for a in p._actions:  # argparse has no public accessor for its actions
        if a.help and a.help != argparse.SUPPRESS:
            a.help = plain(a.help)
    _short_usage(p)


SHORT_USAGE_FROM = 24  # a command with more flags shows only its ungrouped ones in the usage line


def _short_usage(p: argparse.ArgumentParser) -> None:
    """A command with many flags: the usage names the flags a newcomer needs (those outside the ``advanced: ...``
    groups, required first, as required), then ``[FLAGS ...]`` for the advanced ones, listed under their titles."""
    shown = [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, _HelpAll)]
    if p.usage or len(shown) <= SHORT_USAGE_FROM:
        return
    main = [a for g in p._action_groups if not (g.title or "").startswith("advanced")
            for a in g._group_actions  # argparse has no public accessor for a group's flags
            if a.help != argparse.SUPPRESS and a.option_strings and not isinstance(a, (argparse._HelpAction, _HelpAll))]
    needed = lambda a: a.required or getattr(a, "shown_required", False)  # noqa: E731
    parts = [_usage_part(a, needed(a)) for a in sorted(main, key=lambda a: not needed(a))] + ["[FLAGS ...]"]
    lines, line = [], "%(prog)s"
    indent = " " * (len(p.prog) + len("usage: ") + 1)
    for part in parts:
        if len(line) + len(part) > 100:
            lines.append(line)
            line = indent[:-1]
        line += " " + part
    p.usage = "\n".join(lines + [line])


def _usage_part(a: argparse.Action, required: bool) -> str:
    flag = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
    if a.nargs == 0:
        part = flag
    else:
        metavar = a.metavar or (choices_metavar(a.choices) if a.choices else a.dest.upper())
        part = f"{flag} [{metavar}]" if a.nargs == "?" else f"{flag} {metavar}"
    return part if required else f"[{part}]"


def _with_default(argv: list[str], default: str, names: set[str]) -> list[str]:
    """``argv`` with the default subcommand put in front when none is named (a launcher's ``--local_rank=N``
    stays first)."""
    lead = []
    rest = list(argv)
    while rest and rest[0].startswith(("--local_rank", "--local-rank")):
        lead.append(rest.pop(0))
        if "=" not in lead[-1] and rest:
            lead.append(rest.pop(0))
    if rest and rest[0] in names:
        return lead + rest
    return [default] + lead + rest


# ---------------------------------------------------------------- the shared flags (one vocabulary)
def add_out(p: argparse.ArgumentParser, help: str, *, required: bool = True, metavar: str = "OUT",
            aliases: Iterable[str] = (), **kw) -> None:
    """``--out``: where the command writes (old spellings in ``aliases`` keep working, hidden from help)."""
    p.add_argument("--out", required=required, metavar=metavar, help=help, **kw)
    for a in aliases:
        p.add_argument(a, dest="out", help=argparse.SUPPRESS, **kw)
    _note_aliases(p, "--out", aliases)


def add_overwrite(p: argparse.ArgumentParser, what: str = "--out") -> None:
    """``--overwrite``: replace an existing file or directory at ``what`` that this tool did not write (the one
    output rule: ``ropescale.common.io.claim_output_file``)."""
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace what {what} names even when this tool did not write it (without it, only a new path "
                        "or this tool's own earlier output is replaced)")


def add_resume(p: argparse.ArgumentParser, default: str, *, checkpoint: bool = False) -> None:
    """``--resume {auto,never}`` (a fine-tune also takes a CHECKPOINT directory), the same words in every stage that
    writes a run directory (``ropescale.common.runs.resume.RESUME_HELP``); ``default``: what the stage does without the
    flag. A bare ``--resume`` is ``auto``."""
    from .runs.resume import RESUME_HELP, RESUME_MODES

    def mode(v: str) -> str:
        if v in RESUME_MODES or checkpoint:
            return v
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(RESUME_MODES)}, got {v!r}")

    metavar = "{auto,never}" + ("|CHECKPOINT" if checkpoint else "")
    extra = "; CHECKPOINT: continue from that checkpoint directory" if checkpoint else ""
    p.add_argument("--resume", nargs="?", const="auto", default=default, type=mode, metavar=metavar,
                   help=f"{RESUME_HELP}{extra} (default: {default})")


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def print_result(result, as_json: bool, text: str | Callable[[], str]) -> int:
    """A command's result on stdout: with ``--json`` one JSON object, else ``text`` (or ``text()``) for people.
    Returns 0, the command's exit code."""
    if as_json:
        print(json.dumps(result, ensure_ascii=False, default=str))
    else:
        out = text() if callable(text) else text
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
    return 0


def _format(v: str) -> str:
    v = FORMAT_ALIASES.get(str(v).lower(), str(v).lower())
    if v not in FORMATS:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(FORMATS)}")
    return v


def add_format(p: argparse.ArgumentParser, default: str = "markdown") -> None:
    """``--format {markdown,csv,json}`` (``md`` accepted) and ``--json`` as its shorthand."""
    p.add_argument("--format", type=_format, default=default, metavar=choices_metavar(FORMATS),
                   help=f"table format (default: {default})")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")


DTYPES = ("auto", "bf16", "fp16", "fp32")  # --dtype, every tool; auto: each tool says what it picks
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch's (and vLLM's) names


def dtype_name(v) -> str:
    """``--dtype``'s value as one of :data:`DTYPES` (torch's names, ``float32`` ..., accepted); ValueError
    otherwise."""
    name = str(v).strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"expected one of {', '.join(DTYPES)}, got {v!r}")
    return name


def torch_dtype(name: str, *, cuda: bool):
    """The torch dtype of a ``--dtype`` value; ``auto``: bf16 on CUDA, fp32 on CPU."""
    import torch

    name = dtype_name(name or "auto")
    if name == "auto":
        return torch.bfloat16 if cuda else torch.float32
    return getattr(torch, TORCH_NAMES[name])


def _dtype_arg(v: str) -> str:
    try:
        return dtype_name(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_dtype(p, auto: str, default: str = "auto") -> None:
    """``--dtype {auto,bf16,fp16,fp32}`` on a plain parser (a settings field uses ``parse=dtype_name,
    choices=DTYPES``); ``auto`` says what auto picks there."""
    p.add_argument("--dtype", type=_dtype_arg, default=default, metavar=choices_metavar(DTYPES),
                   help=f"weights' dtype; auto: {auto} (default: {default})")


def _note_aliases(p: argparse.ArgumentParser, flag: str, aliases: Iterable[str]) -> None:
    aliases = list(aliases)
    if aliases:
        note = "old spellings still accepted: " + ", ".join(f"{a} (now {flag})" for a in aliases)
        p.epilog = f"{p.epilog}\n\n{note}" if p.epilog else note


def add_alias(p: argparse.ArgumentParser, flag: str, *aliases: str, **kw) -> None:
    """Old spellings of ``flag`` (same destination, hidden from help, listed once at the end of it)."""
    dest = flag.lstrip("-").replace("-", "_")
    for a in aliases:
        p.add_argument(a, dest=kw.pop("dest", dest), help=argparse.SUPPRESS, **kw)
    _note_aliases(p, flag, aliases)
