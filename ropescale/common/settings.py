"""Settings: one dataclass per stage, and everything built from it.

A stage's settings (``ropescale.training.config.TrainSettings``, ``ropescale.evaluation.generate.GenerateSettings``
with ``evaluation.backends.BackendSettings`` nested, ``ropescale.probes.common.ProbeSettings`` and each probe's
subclass of it, ``data_concat.pack.PackSettings``, the demo's ``ropescale.demo.DemoSettings``, an experiment's
``ropescale.experiments.runner.ExperimentSettings``) are a dataclass whose fields carry their help
text, flag, checks and resume rule (:func:`setting`); the RoPE spec (``rope_scaling.RopeSpec``) is nested with
:func:`nested`. From that one list:

- the command line: :func:`add_settings` (a stage's flags, :func:`add_arguments`, and ``--recipe FILE``; help
  in plain words, each default shown once, old flag spellings accepted but not shown, choices as ``{a,b}``,
  required settings shown as required) and :func:`from_args` (defaults < recipe < flags given; a required
  setting missing from both is :class:`MissingSettings`, which a tool reports as argparse does, exit code 2);
- a recipe: :func:`read_recipe` (YAML; an unknown key, a value of the wrong type or out of range is an
  :class:`~ropescale.common.io.InputError` naming ``file:line``);
- the settings themselves: :func:`resolve` (defaults < recipe < flags given) and :func:`build`;
- ``run.json``: :func:`to_record` / :func:`from_record` (flat, like a recipe);
- resume checks: ``ropescale.common.runs.resume.settings_diff`` (what differs between the settings of a run and
  those of a resume, by each field's resume rule).

Keys are flat: a nested field's keys sit beside the outer ones (``rope: ntk``, ``scale: 8`` in a recipe, ``--rope
ntk --scale 8`` on the command line, ``"rope": "ntk", "scale": 8`` in a record).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

from .io import InputError

MISSING = dataclasses.MISSING
RECIPE_HELP = "YAML file of these settings (flags override it)"


class MissingSettings(InputError):
    """Required settings that neither a flag nor the recipe gave: ``the following arguments are required: --x``
    (argparse's words; ``ropescale.common.cli.Tool`` prints it as argparse does, with the usage, exit code 2)."""

    def __init__(self, flags: Iterable[str]):
        self.flags = list(flags)
        super().__init__("the following arguments are required: " + ", ".join(self.flags))
RESUME_RULES = ("same", "path", "grow", "ignore")


@dataclasses.dataclass(frozen=True)
class Meta:
    """What a settings field says about itself (see :func:`setting`)."""

    help: str
    key: str | None = None  # the flat key (recipe key, argparse dest); default: the field name
    flag: str | None = None  # the flag; default "--" + key with dashes
    aliases: tuple[str, ...] = ()  # old flag spellings (accepted, not shown); recipes accept them as keys too
    negative: str | None = None  # a bool's "off" flag, e.g. --no-cuda-graph
    metavar: str | None = None
    choices: tuple | None = None
    check: tuple[Callable[[Any], bool], str] | None = None  # (test, what the value must be)
    parse: Callable[[Any], Any] | None = None  # converter replacing the one the type implies
    cli: bool = True  # a flag
    recipe: bool = True  # a recipe key
    required: bool = False  # must be given (flag or recipe)
    resume: str = "same"  # same | path (compared resolved) | grow (may only increase) | ignore
    group: str | None = None  # help section
    show_default: bool = True


def setting(default: Any = MISSING, help: str = "", **meta: Any):
    """A settings field: ``lr: float = setting(2e-5, "AdamW learning rate", check=positive)``. A list default is
    copied per instance. ``meta`` as :class:`Meta`."""
    m = Meta(help=help, **meta)
    if m.resume not in RESUME_RULES:
        raise ValueError(f"resume rule {m.resume!r}")
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=tuple(default): list(d), metadata={"setting": m})
    return dataclasses.field(default=default, metadata={"setting": m})


def nested(cls, *, resume: str = "same", group: str | None = None):
    """A nested settings dataclass (its keys are flattened into the outer one's)."""
    return dataclasses.field(default_factory=cls, metadata={"nested": True, "resume": resume, "group": group})


# ---------------------------------------------------------------- value conversion (flags and recipes alike)
def _number(v) -> float:
    """A finite number (YAML 1.1 reads ``5e6`` without a dot as a string: numeric strings count)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a number, got {v!r}")
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    return x  # nan / inf are reported by Spec.problem, naming the flag or the recipe line


def _integer(v) -> int:
    """An integer: an int, an integral float (4096.0) or a string of digits; never a bool or 8.5."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise ValueError(f"expected an integer, got {v!r}")
    try:
        return int(v.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _boolean(v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _string(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ValueError(f"expected a string, got {v!r}")
    return str(v)


def _items(v) -> list:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return [x for x in re.split(r"[,\s]+", str(v)) if x]
    raise ValueError(f"expected a list (a YAML list or comma-separated), got {v!r}")


def _str_list(v) -> list[str]:
    return [_string(x) for x in _items(v)]


def _int_list(v) -> list[int]:
    return [_integer(x) for x in _items(v)]


def _float_list(v) -> list[float]:
    return [_number(x) for x in _items(v)]


_CONVERTERS = {int: _integer, float: _number, bool: _boolean, str: _string}
_NONE_WORDS = ("none", "null", "")


def converter(tp) -> tuple[Callable[[Any], Any], bool]:
    """(convert, optional) for a field type: int, float, bool, str, list[str], list[int], list[float], or
    ``X | None``."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0] if len(args) == 1 else tp
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp) or (str,)
        return {int: _int_list, float: _float_list}.get(inner, _str_list), optional
    if tp in _CONVERTERS:
        return _CONVERTERS[tp], optional
    return (lambda v: v), optional


# ---------------------------------------------------------------- the flattened field list
@dataclasses.dataclass(frozen=True)
class Spec:
    """One flat setting: its key, where it lives (``("rope", "scale")``), type, default and :class:`Meta`."""

    key: str
    path: tuple[str, ...]
    type: Any
    default: Any
    meta: Meta
    owner: type

    @property
    def flag(self) -> str:
        return self.meta.flag or flag_of(self.key)

    @property
    def accepted_keys(self) -> tuple[str, ...]:
        return (self.key,) + tuple(a.lstrip("-").replace("-", "_") for a in self.meta.aliases)

    def convert(self, v):
        """``v`` (a flag's string or a recipe's YAML value) as this setting's type (ValueError saying what was
        expected); a custom ``parse`` replaces the type's converter."""
        conv, optional = converter(self.type)
        if v is None or (optional and isinstance(v, str) and v.strip().lower() in _NONE_WORDS + ("auto",)
                         and self.meta.parse is None):
            if optional or self.default is None:
                return None
            raise ValueError("needs a value")
        v = (self.meta.parse or conv)(v)
        if self.meta.choices is not None and v not in self.meta.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.meta.choices))}, got {v!r}")
        return v

    def problem(self, v) -> str | None:
        """What is wrong with a converted value ("must be >= 1, got 0"), or None."""
        if isinstance(v, float) and not math.isfinite(v):
            return f"must be a finite number, got {v}"
        if v is not None and self.meta.choices is not None and v not in self.meta.choices:
            return f"must be one of {', '.join(map(str, self.meta.choices))}, got {fmt(v)}"
        if v is None or self.meta.check is None:
            return None
        test, want = self.meta.check
        if isinstance(v, list):
            bad = [x for x in v if not test(x)]
            return f"must {_be(want)}, got {fmt(v)}" if bad else None
        return None if test(v) else f"must {_be(want)}, got {fmt(v)}"

    def default_value(self):
        return self.default() if callable(self.default) and not isinstance(self.default, type) else self.default


def _be(want: str) -> str:
    """'>= 1' -> 'be >= 1'; 'not be negative' stays."""
    return want if want.startswith("not ") else f"be {want}"


def flag_of(key: str) -> str:
    return "--" + key.replace("_", "-")


def specs(cls) -> list[Spec]:
    """The flat settings of a settings dataclass (nested dataclasses expanded in place)."""
    cached = _SPECS.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    out: list[Spec] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            for s in specs(hints[f.name]):
                out.append(dataclasses.replace(s, path=(f.name,) + s.path))
            continue
        m = f.metadata.get("setting")
        if m is None:
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory if f.default_factory is not MISSING else MISSING)
        out.append(Spec(m.key or f.name, (f.name,), hints[f.name], default, m, cls))
    keys = [s.key for s in out]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise TypeError(f"{cls.__name__}: duplicate setting keys {dup}")
    _SPECS[cls] = out
    return out


_SPECS: dict[type, list[Spec]] = {}


def spec_by_key(cls) -> dict[str, Spec]:
    return {s.key: s for s in specs(cls)}


def nested_fields(cls) -> dict[str, type]:
    """The fields of a settings dataclass that hold a nested settings dataclass (``metadata["nested"]``), by name."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.metadata.get("nested")}


# ---------------------------------------------------------------- formatting
def fmt(v) -> str:
    """A value as a person writes it: none, true/false, 2e-05 -> 2e-05, lists comma-joined."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(map(fmt, v))
    return str(v)


def plain(text: str) -> str:
    """Docstring text as plain words for --help: reST roles and double backquotes removed."""
    text = re.sub(r":(?:mod|func|class|meth|data|attr|obj):`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


# ---------------------------------------------------------------- command line
class _Store(argparse.Action):
    """Store a converted value; an InputError-free argparse error names the flag and what was expected."""

    def __init__(self, option_strings, dest, spec: Spec, const_value=MISSING, **kw):
        self.spec = spec
        self.const_value = const_value
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if self.const_value is not MISSING and values is None:
            v = self.const_value
        else:
            try:
                v = self.spec.convert(values)
            except ValueError as e:
                raise argparse.ArgumentError(self, str(e)) from None
        setattr(namespace, self.dest, v)


def choices_metavar(choices: Iterable) -> str:
    """How every tool shows a flag's choices: ``{a,b,c}`` (argparse's own style)."""
    return "{" + ",".join(map(str, choices)) + "}"


def add_arguments(parser: argparse.ArgumentParser, cls, *, suppress_defaults: bool = True, skip: Iterable[str] = (),
                  groups: dict[str, str] | None = None, required: Iterable[str] = ()) -> argparse.ArgumentParser:
    """Add a flag per setting of ``cls`` (see module doc). With ``suppress_defaults`` (stages) a flag that is not
    given is absent from the parsed namespace, so given flags can override a recipe (:func:`given`); otherwise the
    namespace holds every default (simple tools). ``groups`` maps a field's ``group`` name to a help title.
    ``required``: keys this command needs besides those marked ``required`` (shown as required in the usage; a
    recipe may give them, so :func:`from_args` checks them, not argparse)."""
    skip, required = set(skip), set(required)
    sections: dict[str | None, Any] = {}
    aliases = []
    nested_groups = {name: f.metadata.get("group") for name, f in
                     ((f.name, f) for f in dataclasses.fields(cls)) if f.metadata.get("nested")}
    group_of = {s.key: s.meta.group or (nested_groups.get(s.path[0]) if len(s.path) > 1 else None) for s in specs(cls)}
    titles = {gname: (groups or {}).get(gname, gname) for gname in group_of.values() if gname is not None}
    for gname in sorted(titles, key=lambda g: titles[g].startswith("advanced")):  # the "advanced: ..." groups last
        sections[gname] = parser.add_argument_group(titles[gname])
    sections[None] = parser
    for s in specs(cls):
        m = s.meta
        if not m.cli or s.key in skip:
            continue
        g = sections[group_of[s.key]]
        default = argparse.SUPPRESS if suppress_defaults else s.default_value()
        help_text = plain(m.help)
        dv = s.default_value()
        if m.show_default and dv is not None and dv is not MISSING and "default" not in help_text.lower():
            help_text += f" (default: {fmt(dv)})"
        kw: dict[str, Any] = dict(dest=s.key, default=default, help=help_text, spec=s)
        conv, optional = converter(s.type)
        is_bool = conv is _boolean
        if is_bool:
            kw.update(nargs="?", const_value=True, metavar="BOOL")
        else:
            kw["metavar"] = m.metavar or (choices_metavar(m.choices) if m.choices else s.key.upper())
        action = g.add_argument(s.flag, action=_Store, **kw)
        action.shown_required = m.required or s.key in required  # the usage shows it without brackets
        for a in m.aliases:
            akw = dict(kw, help=argparse.SUPPRESS)
            g.add_argument(a, action=_Store, **akw)
            aliases.append(f"{a} (now {s.flag})")
        if m.negative:
            g.add_argument(m.negative, dest=s.key, action="store_const", const=False, default=default,
                           help=f"the same as {s.flag} false")
    if aliases:
        note = "old spellings still accepted: " + ", ".join(aliases)
        parser.epilog = f"{parser.epilog}\n\n{note}" if parser.epilog else note
    return parser


def add_settings(parser: argparse.ArgumentParser, cls, *, required: Iterable[str] = (), recipe_help: str = RECIPE_HELP,
                 **kw) -> argparse.ArgumentParser:
    """A stage's command line: the flags of ``cls`` (:func:`add_arguments`; ``required``: the keys this command
    needs, from a flag or the recipe) and ``--recipe FILE``; :func:`from_args` reads them back."""
    add_arguments(parser, cls, required=required, **kw)
    parser.add_argument("--recipe", metavar="FILE", help=recipe_help)
    parser.set_defaults(settings_class=cls, required_settings=tuple(required))
    return parser


def from_args(args: argparse.Namespace, cls=None, *, recipe: str | Path | None = None, search: Path | None = None):
    """The settings a parsed command line asks for (:func:`add_settings`): defaults < the recipe (``recipe``, else
    ``--recipe``) < the flags given, checked; a required setting neither gave is :class:`MissingSettings`."""
    cls = cls or args.settings_class
    out = resolve(cls, given(args, cls), recipe or getattr(args, "recipe", None), search=search)
    require(out, getattr(args, "required_settings", ()))
    return out


def require(settings, keys: Iterable[str]) -> None:
    """:class:`MissingSettings` naming the flags of ``keys`` whose value is None."""
    by_key = spec_by_key(type(settings))
    missing = [by_key[k].flag for k in keys if value_of(settings, by_key[k]) is None]
    if missing:
        raise MissingSettings(missing)


def given(namespace: argparse.Namespace, cls) -> dict[str, Any]:
    """The settings of ``cls`` a parsed namespace holds (with suppressed defaults: the flags actually given)."""
    keys = {s.key for s in specs(cls)}
    return {k: v for k, v in vars(namespace).items() if k in keys}


# ---------------------------------------------------------------- recipes
def _line_of(text: str, key: str) -> int | None:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*{re.escape(key)}\s*:", line):
            return i
    return None


def _recipe_path(path: str | Path, search: Path | None) -> Path:
    """The recipe file ``path`` names: the path itself, else (a bare name) the YAML file of that name in
    ``search``; an InputError when it is a directory or nothing."""
    p = Path(path)
    if not p.is_file() and search is not None:
        alt = search / (str(path) if str(path).endswith(".yaml") else f"{path}.yaml")
        if alt.is_file():
            p = alt
    if p.is_dir():
        raise InputError("is a directory, expected a recipe file (YAML)", p)
    if not p.is_file():
        raise InputError("no such recipe", path)
    return p


def read_recipe(path: str | Path, cls, *, search: Path | None = None) -> dict[str, Any]:
    """A recipe: a YAML mapping of ``cls``'s keys (old spellings too) -> converted, checked values. An unknown
    key, a value of the wrong type or out of range is an InputError naming ``file:line``. ``search``: a folder
    where a bare name (``tiny_demo`` or ``tiny_demo.yaml``) is looked up."""
    import yaml

    p = _recipe_path(path, search)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise InputError(f"malformed YAML: {getattr(e, 'problem', e)}", p, None if line is None else line + 1) \
            from None
    if not isinstance(data, dict):
        raise InputError("a recipe is a YAML mapping of key: value", p)
    by_key = {}
    for s in specs(cls):
        if s.meta.recipe:
            for k in s.accepted_keys:
                by_key[k] = s
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = str(k).replace("-", "_")
        line = _line_of(text, str(k))
        s = by_key.get(name)
        if s is None:
            known = sorted(x.key for x in specs(cls) if x.meta.recipe)
            raise InputError(f"unknown recipe key {k!r} (known: {', '.join(known)})", p, line)
        try:
            value = s.convert(v)
        except ValueError as e:
            raise InputError(f"bad value for {k!r}: {e}", p, line) from None
        problem = s.problem(value)
        if problem:
            raise InputError(f"bad value for {k!r}: {problem}", p, line)
        out[s.key] = value
    return out


# ---------------------------------------------------------------- building, checking, records, diffs
def build(cls, values: dict[str, Any] | None = None):
    """An instance of ``cls`` from flat ``values`` (converted) over the defaults; nested dataclasses built from
    their keys (their own checks, e.g. RopeSpec's, run on construction). A setting marked ``required`` that has
    no value is :class:`MissingSettings` naming its flag."""
    values = dict(values or {})
    kw: dict[str, Any] = {}
    for name, sub in nested_fields(cls).items():
        keys = {s.key for s in specs(sub)}
        kw[name] = build(sub, {k: values.pop(k) for k in list(values) if k in keys})
    by_key = spec_by_key(cls)
    for k, v in values.items():
        s = by_key[k]
        if len(s.path) == 1:
            kw[s.path[0]] = v
    missing = [s.flag for s in specs(cls)
               if len(s.path) == 1 and s.meta.required and kw.get(s.path[0], s.default_value()) in (None, MISSING)]
    if missing:
        raise MissingSettings(missing)
    return cls(**kw)


def make(cls, base=None, **kw):
    """Settings for Python callers: ``make(GenerateSettings, model=..., rope=RopeSpec("ntk", 8), cache="static")``
    -- flat keys, or a nested field given whole (None: its defaults), over ``base`` (an instance) or the
    defaults. An unknown key is a TypeError."""
    vals = values(base) if base is not None else {}
    for name, sub in nested_fields(cls).items():
        if name in kw and (kw[name] is None or isinstance(kw[name], sub)):
            inst = kw.pop(name) or sub()
            vals.update({s.key: value_of(inst, s) for s in specs(sub)})
    unknown = sorted(set(kw) - set(spec_by_key(cls)))
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown setting(s) {', '.join(unknown)}")
    vals.update(kw)
    return build(cls, vals)


def check(settings, *, where: str | None = None) -> None:
    """Every setting's value passes its check (InputError naming the flag); call before any work."""
    for s in specs(type(settings)):
        problem = s.problem(value_of(settings, s))
        if problem:
            raise InputError(f"{s.flag} {problem}", where)


def value_of(settings, s: Spec):
    obj = settings
    for p in s.path:
        obj = getattr(obj, p)
    return obj


def values(settings) -> dict[str, Any]:
    """The flat key -> value map of a settings instance."""
    return {s.key: value_of(settings, s) for s in specs(type(settings))}


def resolve(cls, flags: dict[str, Any], recipe: str | Path | None = None, *, search: Path | None = None):
    """defaults < recipe < flags given: the settings a command runs with (checked)."""
    merged = read_recipe(recipe, cls, search=search) if recipe else {}
    merged.update(flags)
    out = build(cls, merged)
    check(out)
    return out


def _jsonable(v):
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def to_record(settings, *, without: Iterable[str] = ()) -> dict[str, Any]:
    """The settings as run.json records them: flat ``key: value`` with the keys of the flags and recipes (a run's
    record reads like a recipe). ``without``: nested fields left out (a run records the rope it ran with
    instead of the one asked for)."""
    without = set(without)
    return {s.key: _jsonable(value_of(settings, s)) for s in specs(type(settings))
            if s.meta.recipe and not (len(s.path) > 1 and s.path[0] in without)}


def from_record(cls, record: dict | None, *, where=None, without: Iterable[str] = ()):
    """Settings from a run.json record (:func:`to_record`; a nested dict such as ``"rope": {"method": ...}`` is
    read too). Unknown keys are left out (a record may be newer or older than the code); a value that does not
    convert is an InputError naming ``where``. ``without``: nested fields left at their defaults (a run records
    the rope it ran with, not the one asked for)."""
    record = dict(record or {})
    flat: dict[str, Any] = {}
    skipped = {s.key for name in without for s in specs(nested_fields(cls)[name])}
    for name in without:
        record.pop(name, None)
    record = {k: v for k, v in record.items() if k not in skipped}
    for name, sub in nested_fields(cls).items():
        rec = record.get(name)
        if isinstance(rec, dict):
            record.pop(name)
            for s in specs(sub):
                for k in (s.path[-1], s.key):
                    if k in rec and s.key not in flat:
                        flat[s.key] = rec[k]
    for s in specs(cls):
        for k in s.accepted_keys:
            if k in record and s.key not in flat:
                flat[s.key] = record[k]
    conv = {}
    by_key = spec_by_key(cls)
    for k, v in flat.items():
        try:
            conv[k] = by_key[k].convert(v)
        except ValueError as e:
            raise InputError(f"recorded setting {k!r}: {e}", where) from None
    return build(cls, conv)
