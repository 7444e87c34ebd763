"""An experiment file (YAML, docs/experiments.md): what it may hold, read and checked in one place.

Top-level keys: ``name``, ``title``, ``about``, ``seeds``, ``lengths``, ``vars`` (values the flag lists name as
``{key}``; a list var standing alone as ``{key}`` becomes its items), ``prepare`` (files made once per seed and
length before the arms: ``NAME: {out: PATH, run: [flags]}``; the arms name the file as ``{NAME}``), ``arms``
(``NAME: {label, run: [flags], field}``, the flags of a ``ropescale`` command: ``[eval, generate, ...]``; run once
per seed and length with ``--out`` a run directory and ``--resume auto``; or ``{label, reads: ARM, field}``: another
field of ARM's runs, running nothing), ``pools`` (rows that average arms per sample: ``NAME: {label, arms:
[...]}``), ``score`` (``file``, ``field``, ``id``, ``name``, ``kind``: mean or proportion, ``make``: the command
that writes the file into ``{run}`` when it is missing, ``range``: [lo, hi], the score's range, e.g. [0, 100] for a
share in percent: a mean's interval stays inside it; ``partial: true``: a record without the field is not one of
the score's samples, e.g. a control made for some keys only), ``table`` (the rows shown, arms or pools), ``families``
(``NAME: [[a, b], ...]``: the comparisons a - b read together, BH q per family), ``work`` (the work directory,
repository-relative, default runs/experiments/NAME: one in the repository keeps the records with the file) and
``quick`` (overrides of ``seeds``, ``lengths``, ``vars`` and ``arms``, a list: the miniature a test runs; it
always works in runs/experiments/NAME-quick). ``scores`` holds several scores
(``NAME: {...}`` as ``score``, plus ``unit``, ``length``: the record field a length-less arm's records carry their
length in, ``column``, ``table``); an arm names the ones it has (``scores: [...]``, default the first), a family
the one it reads (``NAME: {score, pairs}``; ``{score, rows, baseline: [lo, hi]}``: each row against its own mean
over the lengths lo <= L < hi, on the same ids; ``{score, mse: [[IE, IB], ...]}``: a row's MSE(P-IE vs P-IB) over
its lengths; ``{score, pairs, within: [lo, hi]}``: one test a pair, each id's a - b over the lengths lo <= L <
hi, the id the block: t over ids, ``stats.tests.t_over_windows``); a score's ``digits``: its decimals on the page.
An arm whose flags name no ``{length}`` (nor a prepared file that does) runs once a seed; ``lengths: [...]`` on an
arm: the lengths it runs at; ``facts: {NAME: dotted.key}``: values of its runs' run.json shown beside its row.

Every mistake a user can make is an :class:`~ropescale.common.io.InputError` naming the file and line.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path

from ropescale.common.io import InputError

KEYS = ("name", "title", "about", "seeds", "lengths", "vars", "prepare", "arms", "pools", "score", "scores",
        "table", "families", "quick", "work")
KINDS = ("mean", "proportion")
UNITS = ("sample", "window")  # what one id of a score is: the paired tests' unit (never a bucket: see score())
SCORE_KEYS = ("file", "field", "id", "name", "make", "kind", "unit", "length", "column", "table", "digits",
              "range", "partial")
ARM_KEYS = ("label", "run", "reads", "field", "fields", "scores", "facts", "lengths", "group")
QUICK_KEYS = ("seeds", "lengths", "vars", "arms")
RUNTIME = ("seed", "length", "run", "out", "work")  # placeholders the runner fills in
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Arm:
    """One arm: its name, label and the flag list of the ``ropescale`` command it runs (placeholders unfilled)."""

    name: str
    label: str
    run: tuple  # () for an arm that reads another's runs
    reads: str | None = None  # an arm whose run directories this one reads (runs nothing), e.g. a floor
    field: str | None = None  # the score field read, for each of its scores (default: the score's field)
    fields: dict = dc_field(default_factory=dict)  # score -> the field read for that score (over ``field``)
    scores: tuple = ()  # the scores its runs have (the file's: the first score when it names none)
    facts: dict = dc_field(default_factory=dict)  # fact -> a dotted key of its runs' run.json, shown beside its row
    per_length: bool = True  # runs once per seed and length (its flags name {length}); else once per seed
    lengths: tuple = ()  # the experiment's lengths it runs at (empty: every one)
    group: str | None = None  # only its runs' records whose ``group`` field is this (a probe writing two variants)

    def field_of(self, score: "Score") -> str:
        return self.fields.get(score.key) or self.field or score.field

    def has(self, score: str) -> bool:
        return not self.scores or score in self.scores


@dataclass(frozen=True)
class Score:
    """Where a run's per-sample score lives: ``file`` in the run directory, one JSON object a line with ``id`` and
    ``field``; ``make`` writes the file when it is missing (a flag list with ``{run}``)."""

    file: str = "sample_scores.jsonl"
    field: str = "rouge_l"
    id: str = "id"
    name: str = "ROUGE-L"
    make: tuple = ()
    kind: str = "mean"  # mean | proportion (scores 0 or 1: a cell is k of n trials, Wilson, shown in percent)
    unit: str = "sample"  # what one id is (sample, window): the unit of the paired tests, named on the page
    length: str | None = None  # the record field holding the length a record is at (an arm run once per seed)
    column: str = "T"  # a column's header: COLUMN + length (T512; "pos " for bucket starts)
    table: tuple = ()  # the rows shown for this score (default: the experiment's table, the rows that have it)
    digits: int = 1  # decimals of its cells and tests on the page
    range: tuple | None = None  # (lo, hi): the score's range; a mean's interval stays inside it (stats.means bounds)
    partial: bool = False  # a record without ``field`` is not this score's sample (a measure made for some records)
    key: str = "score"  # its name in ``scores:`` (``score`` for the one ``score:`` block)


@dataclass(frozen=True)
class Family:
    """Comparisons read together (BH q over their tests): ``pairs`` a - b at every length, or each of ``rows``
    against its own mean over the lengths ``baseline`` [lo, hi) on the same ids; on the score ``score``."""

    name: str
    score: str
    pairs: tuple = ()
    rows: tuple = ()
    baseline: tuple | None = None
    mse: bool = False  # pairs: (IE, IB) of a row: one MSE(P-IE vs P-IB) test a pair over every length
    within: tuple | None = None  # (lo, hi): one test a pair, a - b over the lengths lo <= L < hi within each id

    def items(self) -> list[tuple[str, str]]:
        """(a, b) of each comparison; b of a row against its baseline is ``ROW[lo:hi]``."""
        if self.baseline is None:
            return list(self.pairs)
        lo, hi = self.baseline
        return [(r, f"{r}[{lo}:{hi}]") for r in self.rows]


@dataclass(frozen=True)
class Experiment:
    """A study: arms x seeds x lengths, the score, the rows shown and the comparison families."""

    path: Path
    name: str
    title: str
    about: str
    seeds: tuple
    lengths: tuple
    vars: dict
    prepare: dict  # name -> (out, run)
    arms: dict  # name -> Arm
    pools: dict  # name -> (label, arm names)
    scores: dict  # name -> Score (the first: the one ``score:`` block)
    table: tuple
    families: dict  # name -> Family
    quick: bool = False
    work: str | None = None  # the work directory (repository-relative) when it is not runs/experiments/NAME
    lines: dict = dc_field(default_factory=dict, compare=False)

    @property
    def score(self) -> Score:
        """The first score (the only one of a file with ``score:``)."""
        return next(iter(self.scores.values()))

    def rows_of(self, score: Score) -> tuple:
        """The rows shown for a score: its ``table`` or the experiment's, those whose every arm has the score."""
        return tuple(s for s in (score.table or self.table)
                     if all(a not in self.arms or self.arms[a].has(score.key) for a in self.members(s)))

    def label(self, series: str) -> str:
        return self.pools[series][0] if series in self.pools else self.arms[series].label

    def members(self, series: str) -> tuple:
        """The arms a row averages per sample (an arm: itself)."""
        return tuple(self.pools[series][1]) if series in self.pools else (series,)


def _line(text: str, key: str) -> int | None:
    for i, ln in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*-?\s*([\"']?){re.escape(str(key))}\1\s*:", ln):  # a key, quoted or not
            return i
    return None


class Reader:
    """The checks of one file: each error names the file and the line of the key it is about."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, key, what: str):
        raise InputError(what, self.path, _line(self.text, key) if key is not None else None)

    def mapping(self, v, key) -> dict:
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.fail(key, f"{key}: expected a mapping of name: value")
        return v

    def ints(self, v, key) -> tuple:
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            v = [x for x in re.split(r"[,\s]+", str(v)) if x]
        if not isinstance(v, list) or not v:
            self.fail(key, f"{key}: expected a non-empty list of integers")
        try:
            out = tuple(int(x) for x in v)
        except (TypeError, ValueError):
            self.fail(key, f"{key}: expected integers, got {v!r}")
        if any(isinstance(x, bool) or x < 0 for x in v if not isinstance(x, str)):
            self.fail(key, f"{key}: expected integers >= 0, got {v!r}")
        return out

    def flags(self, v, key) -> tuple:
        if not isinstance(v, list) or not v or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool)
                                                        for x in v):
            self.fail(key, f"{key}: expected a flag list of a ropescale command, e.g. [eval, generate, --model, tiny]")
        return tuple(str(x) for x in v)

    def name(self, v, key) -> str:
        if not isinstance(v, str) or not NAME.match(v):
            self.fail(key, f"{key}: {v!r} is not a name (letters, digits, '_', '-', '.')")
        return v


def placeholders(flags) -> set:
    """The ``{name}`` fields a flag list uses."""
    out = set()
    for f in flags:
        for _, name, _, _ in string.Formatter().parse(f):
            if name:
                out.add(name)
    return out


def read_yaml(p: Path) -> tuple[dict, Reader]:
    """The file's mapping and its :class:`Reader`."""
    import yaml

    if not p.is_file():
        raise InputError("no such experiment file", p)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"malformed YAML: {getattr(e, 'problem', e)}", p,
                         None if mark is None else mark.line + 1) from None
    r = Reader(p, text)
    if not isinstance(data, dict):
        r.fail(None, "an experiment is a YAML mapping (name, arms, seeds, lengths, score, families, ...)")
    for k in data:
        if k not in KEYS:
            r.fail(k, f"unknown key {k!r} (known: {', '.join(KEYS)})")
    for k in ("name", "arms"):
        if k not in data:
            r.fail(None, f"missing key {k!r}")
    return data, r


def read_vars(r: Reader, data: dict, q: dict, quick: bool) -> dict:
    variables = {str(k): v for k, v in r.mapping(data.get("vars"), "vars").items()}
    if quick:
        for k, v in r.mapping(q.get("vars"), "vars").items():
            if str(k) not in variables:
                r.fail(k, f"quick: vars: {k!r} is not one of the file's vars ({', '.join(variables)})")
            variables[str(k)] = v
    for k in variables:
        if k in RUNTIME:
            r.fail(k, f"vars: {k!r} is a name the runner fills in ({', '.join(RUNTIME)})")
    return variables


def named(r: Reader, data: dict, key: str):
    """(name, mapping) of each entry of the block ``key`` (``prepare``, ``pools``), the name checked."""
    for k, v in r.mapping(data.get(key), key).items():
        yield r.name(k, k), r.mapping(v, k)


def read_prepare(r: Reader, data: dict) -> dict:
    prepare = {}
    for k, v in named(r, data, "prepare"):
        if not isinstance(v.get("out"), str) or "run" not in v:
            r.fail(k, f"prepare: {k}: needs out: PATH (under the work dir) and run: [flags]")
        prepare[k] = (v["out"], r.flags(v["run"], k))
        if "out" not in placeholders(prepare[k][1]):
            r.fail(k, f"prepare: {k}: run: names the file it writes as {{out}}")
    return prepare


def arm_extras(r: Reader, k: str, v: dict) -> dict:
    """An arm's ``field``, ``fields``, ``scores``, ``facts``, ``lengths`` and ``group``, checked."""
    out = {"field": v.get("field") and str(v["field"])}
    fields = r.mapping(v.get("fields"), k)
    out["fields"] = {str(a): str(b) for a, b in fields.items()}
    scores = v.get("scores", [])
    if not isinstance(scores, list) or not all(isinstance(x, str) for x in scores):
        r.fail(k, f"arm {k}: scores: a list of the scores' names")
    out["scores"] = tuple(scores)
    facts = r.mapping(v.get("facts"), k)
    if not all(isinstance(x, str) and x for x in facts.values()):
        r.fail(k, f"arm {k}: facts: NAME: a dotted key of its runs' run.json (e.g. train.coverage)")
    out["facts"] = {str(a): b for a, b in facts.items()}
    out["lengths"] = r.ints(v["lengths"], k) if "lengths" in v else ()
    if "group" in v and not (isinstance(v["group"], str) and v["group"]):
        r.fail(k, f"arm {k}: group: the records' group field to keep (a string, e.g. original)")
    out["group"] = v.get("group")
    return out


def read_arms(r: Reader, data: dict, q: dict, quick: bool) -> dict:
    from ropescale.commands import TOOLS

    arms = {}
    for k, v in r.mapping(data["arms"], "arms").items():
        r.name(k, k)
        v = {"run": v} if isinstance(v, list) else r.mapping(v, k)
        unknown = sorted(set(v) - set(ARM_KEYS))
        if unknown:
            r.fail(k, f"arm {k}: unknown key {unknown[0]!r} (known: {', '.join(ARM_KEYS)})")
        extras = arm_extras(r, k, v)
        if "reads" in v:
            if "run" in v or str(v["reads"]) not in data["arms"] or "reads" in (data["arms"][v["reads"]] or {}):
                r.fail(k, f"arm {k}: reads: names an arm that runs (and then {k} has no run:)")
            arms[k] = Arm(k, str(v.get("label", k)), (), str(v["reads"]), **extras)
            continue
        run = r.flags(v.get("run"), k)
        if run[0] not in TOOLS:
            r.fail(k, f"arm {k}: {run[0]!r} is not a ropescale command (one of {', '.join(TOOLS)})")
        bad = [f for f in ("--out", "--resume") if f in run]
        if bad:
            r.fail(k, f"arm {k}: {bad[0]} is the runner's (each run's directory, continued with --resume auto)")
        arms[k] = Arm(k, str(v.get("label", k)), run, None, **extras)
    if not arms:
        r.fail("arms", "arms: at least one arm")
    if quick and "arms" in q:
        keep = q["arms"]
        if not isinstance(keep, list):
            r.fail("arms", "quick: arms: a list of arm names")
        for a in keep:
            if a not in arms:
                r.fail("arms", f"quick: arms: {a!r} is not an arm ({', '.join(arms)})")
        arms = {k: a for k, a in arms.items() if k in keep}
    return arms


def read_pools(r: Reader, data: dict) -> dict:
    pools = {}
    for k, v in named(r, data, "pools"):
        members = v.get("arms")
        if not isinstance(members, list) or not members:
            r.fail(k, f"pools: {k}: needs arms: [arm, ...]")
        if k in data["arms"]:
            r.fail(k, f"pools: {k} is an arm's name too")
        pools[k] = (str(v.get("label", k)), tuple(str(a) for a in members))
    return pools


def read_score(r: Reader, sc: dict, key: str, where: str) -> Score:
    unknown = sorted(set(sc) - set(SCORE_KEYS))
    if unknown:
        r.fail(unknown[0], f"{where}: unknown key {unknown[0]!r} (known: {', '.join(SCORE_KEYS)})")
    if sc.get("kind", "mean") not in KINDS:
        r.fail("kind", f"{where}: kind: {sc['kind']!r} is not one of {', '.join(KINDS)}")
    if sc.get("unit") == "bucket":  # a window's buckets are correlated: a per-bucket sign flip over-rejects
        r.fail("unit", f"{where}: unit: bucket is not a test unit (a window's buckets are correlated): key the score "
                       f"by its window (id: window, unit: window) and compare buckets with a family's within:")
    if sc.get("unit", "sample") not in UNITS:
        r.fail("unit", f"{where}: unit: {sc['unit']!r} is not one of {', '.join(UNITS)}")
    if "table" in sc and not isinstance(sc["table"], list):
        r.fail("table", f"{where}: table: a list of rows")
    if "digits" in sc and (isinstance(sc["digits"], bool) or not isinstance(sc["digits"], int)
                           or not 0 <= sc["digits"] <= 6):
        r.fail("digits", f"{where}: digits: an integer 0-6 (decimals shown)")
    rng = sc.get("range")
    if rng is not None and not (isinstance(rng, list) and len(rng) == 2
                                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)
                                and rng[0] < rng[1]):
        r.fail("range", f"{where}: range: [lo, hi], two numbers with lo < hi (a share in percent: [0, 100])")
    if "partial" in sc and not isinstance(sc["partial"], bool):
        r.fail("partial", f"{where}: partial: true or false (true: a record without the field is not a sample)")
    conv = {"make": lambda v: r.flags(v, "make"), "table": lambda v: tuple(str(x) for x in v), "digits": int,
            "range": lambda v: (float(v[0]), float(v[1])), "partial": bool}
    return Score(**{k: conv.get(k, str)(v) for k, v in sc.items()}, key=key)


def read_scores(r: Reader, data: dict) -> dict:
    """{name: Score}: the ``scores:`` block, or the one ``score:`` (named ``score``)."""
    if "scores" in data and "score" in data:
        r.fail("scores", "score: or scores:, not both")
    if "scores" not in data:
        return {"score": read_score(r, r.mapping(data.get("score"), "score"), "score", "score")}
    out = {}
    for k, v in r.mapping(data["scores"], "scores").items():
        out[r.name(k, k)] = read_score(r, r.mapping(v, k), k, f"scores: {k}")
    if not out:
        r.fail("scores", "scores: at least one score")
    return out


def read_family(r: Reader, fam: str, v, first: str, variables: dict | None = None) -> Family:
    """One family: a list of [a, b] pairs (on the first score), or {score, pairs} or {score, rows, baseline}."""
    def pairs_of(x):
        if not isinstance(x, list) or not all(isinstance(y, list) and len(y) == 2 for y in x):
            r.fail(fam, f"families: {fam}: a list of [a, b] pairs (a - b)")
        return tuple((str(a), str(b)) for a, b in x)

    if isinstance(v, list):
        return Family(fam, first, pairs_of(v))
    v = r.mapping(v, fam)
    unknown = sorted(set(v) - {"score", "pairs", "rows", "baseline", "mse", "within"})
    if unknown:
        r.fail(fam, f"families: {fam}: unknown key {unknown[0]!r} (known: score, pairs, rows, baseline, mse, within)")
    score = str(v.get("score", first))
    if "within" in v:
        w = [var_int(x, variables or {}) for x in v["within"]] if isinstance(v["within"], list) else v["within"]
        if (not isinstance(w, list) or len(w) != 2 or not all(isinstance(x, int) for x in w) or w[0] >= w[1]
                or "baseline" in v or "mse" in v):
            r.fail(fam, f"families: {fam}: within: [lo, hi] (integers or {{var}}s of them, with pairs): one test a "
                        f"pair over the lengths lo <= L < hi within each id")
        return Family(fam, score, pairs_of(v.get("pairs")), within=(int(w[0]), int(w[1])))
    if "mse" in v:
        if "pairs" in v or "baseline" in v:
            r.fail(fam, f"families: {fam}: mse: [[IE arm, IB arm], ...] stands alone (no pairs, no baseline)")
        return Family(fam, score, pairs_of(v["mse"]), mse=True)
    if "baseline" not in v:
        return Family(fam, score, pairs_of(v.get("pairs")))
    base, rows = v["baseline"], v.get("rows")
    if (not isinstance(base, list) or len(base) != 2 or not all(isinstance(x, int) for x in base)
            or base[0] >= base[1]):
        r.fail(fam, f"families: {fam}: baseline: [lo, hi], the lengths lo <= L < hi a row is compared with")
    if "pairs" in v or not isinstance(rows, list) or not rows:
        r.fail(fam, f"families: {fam}: a baseline family names rows: [row, ...] (each against its own baseline)")
    return Family(fam, score, rows=tuple(str(x) for x in rows), baseline=(int(base[0]), int(base[1])))


def var_int(x, variables: dict):
    """``x``, or the integer var ``{name}`` stands for (quick's value in a quick run); else ``x`` unchanged."""
    if isinstance(x, str) and x.startswith("{") and x.endswith("}") and x[1:-1] in variables:
        v = variables[x[1:-1]]
        return int(v) if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()) else x
    return x


def read_families(r: Reader, data: dict, scores: dict, variables: dict | None = None) -> dict:
    families = {}
    for fam, v in r.mapping(data.get("families"), "families").items():
        families[str(fam)] = f = read_family(r, str(fam), v, next(iter(scores)), variables)
        if f.score not in scores:
            r.fail(fam, f"families: {fam}: score: {f.score!r} is not a score ({', '.join(scores)})")
    return families


def per_length(exp: Experiment, flags) -> bool:
    """Whether flags name ``{length}``, or a prepared file whose path does (made once per length)."""
    used = placeholders(flags)
    return "length" in used or any("length" in placeholders((exp.prepare[k][0],)) for k in used & set(exp.prepare))


def read_work(r: Reader, data: dict) -> str | None:
    """``work:``, a repository-relative directory (the records kept with the file, docs/experiments.md), or None."""
    w = data.get("work")
    if w is None:
        return None
    if not isinstance(w, str) or not w.strip() or Path(w).is_absolute() or ".." in Path(w).parts:
        r.fail("work", "work: a directory inside the repository, relative to its root (e.g. experiments/NAME/work)")
    return w


def load(path: str | Path, *, quick: bool = False) -> Experiment:
    """The experiment ``path`` describes (with ``quick``: its ``quick:`` block applied), every key checked."""
    p = Path(path)
    data, r = read_yaml(p)
    q = r.mapping(data.get("quick"), "quick")
    for k in q:
        if k not in QUICK_KEYS:
            r.fail(k, f"quick: unknown key {k!r} (known: {', '.join(QUICK_KEYS)})")
    seeds = r.ints(q["seeds"] if quick and "seeds" in q else data.get("seeds", [0]), "seeds")
    lengths = r.ints(q["lengths"] if quick and "lengths" in q else data.get("lengths", [0]), "lengths")
    pools = read_pools(r, data)
    arms = read_arms(r, data, q, quick)
    scores = read_scores(r, data)
    table = tuple(str(x) for x in (data.get("table") or (list(pools) or list(arms))))
    variables = read_vars(r, data, q, quick)
    exp = Experiment(p, r.name(data["name"], "name"), str(data.get("title", data["name"])),
                     str(data.get("about", "")).strip(), seeds, lengths, variables, read_prepare(r, data), arms,
                     pools, scores, table, read_families(r, data, scores, variables), quick, read_work(r, data))
    for k, arm in exp.arms.items():  # an arm that reads another's runs: that arm's flags
        v = data["arms"][arm.reads] if arm.reads else arm.run
        flags = arm.run or r.flags(v if isinstance(v, list) else (v or {}).get("run"), arm.reads)
        exp.arms[k] = replace(arm, per_length=per_length(exp, flags), scores=arm.scores or (next(iter(scores)),))
    for k in exp.prepare:
        if k in exp.vars:
            r.fail(k, f"prepare: {k!r} is a var's name too")
    _check_names(r, exp, set(r.mapping(data["arms"], "arms")))
    return exp


def _check_names(r: Reader, exp: Experiment, all_arms: set) -> None:
    """Every row, pool member and pair names an arm or a pool; every placeholder is known. A name that is an arm
    of the full file but left out of a quick run is dropped, not an error."""
    known_series = all_arms | set(exp.pools)
    for k, (_, members) in exp.pools.items():
        for a in members:
            if a not in all_arms:
                r.fail(k, f"pools: {k}: {a!r} is not an arm")
    for s in exp.table + tuple(x for sc in exp.scores.values() for x in sc.table):
        if s not in known_series:
            r.fail("table", f"table: {s!r} is neither an arm nor a pool")
    for fam, f in exp.families.items():
        for s in [x for pair in f.pairs for x in pair] + list(f.rows):
            if s not in known_series:
                r.fail(fam, f"families: {fam}: {s!r} is neither an arm nor a pool")
    for k, arm in exp.arms.items():
        for sc in [*arm.scores, *arm.fields]:
            if sc not in exp.scores:
                r.fail(k, f"arm {k}: {sc!r} is not a score ({', '.join(exp.scores)})")
    _check_placeholders(r, exp)


def _check_placeholders(r: Reader, exp: Experiment) -> None:
    known = set(exp.vars) | set(exp.prepare) | set(RUNTIME)
    for where, flags in ([(k, f) for k, (_, f) in exp.prepare.items()] + [(k, a.run) for k, a in exp.arms.items()]
                         + [("make", sc.make) for sc in exp.scores.values()]
                         + [(k, (o,)) for k, (o, _) in exp.prepare.items()]):
        bad = sorted(placeholders(flags) - known)
        if bad:
            r.fail(where, f"{where}: unknown placeholder {{{bad[0]}}} (known: {', '.join(sorted(known))})")


def fill(flags, values: dict, where: str) -> list[str]:
    """A flag list with its placeholders filled in; an element that is just ``{name}`` of a list var becomes the
    list's items (``finetune_args: [--max-steps, 2]``: none for an empty list)."""
    out = []
    try:
        for f in flags:
            whole = f[1:-1] if f.startswith("{") and f.endswith("}") else None
            if whole in values and isinstance(values[whole], (list, tuple)):
                out += [str(x) for x in values[whole]]
            else:
                out.append(f.format_map({k: v for k, v in values.items() if not isinstance(v, (list, tuple))}))
    except (KeyError, ValueError, IndexError) as e:
        raise InputError(f"{where}: cannot fill in {' '.join(flags)}: {e} (a list var stands alone)") from None
    return out
