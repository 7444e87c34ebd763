"""Issue 17: one CLI style (help in plain words, each default once), old flag spellings still accepted, the same
names for the same ideas, no import circles, an installable package whose command reaches every tool."""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rope_scaling", "data_concat", "ropescale")


def _tools():
    from data_concat.cli import TOOL as data
    from rope_scaling.__main__ import TOOL as rope
    from ropescale.evaluation.cli import TOOL as evaluation
    from ropescale.probes.cli import TOOL as probes
    from ropescale.training.cli import TOOL as finetune

    return {"finetune": finetune, "eval": evaluation, "data": data, "probes": probes, "rope": rope}


def _single_tools():
    """The one-command tools: the same Tool style (issue 26.6)."""
    from rope_scaling.describe import TOOL as describe
    from ropescale.tiny.make_tiny import TOOL as make_tiny
    from ropescale.training.memory.estimate import TOOL as memory_model

    return {"make-tiny": make_tiny, "describe": describe, "memory-model": memory_model}


def _subparsers(ap: argparse.ArgumentParser) -> dict:
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _all_parsers():
    for tool, t in {**_tools(), **_single_tools()}.items():
        ap = t.parser()
        yield tool, ap
        for name, sub in _subparsers(ap).items():
            yield f"{tool} {name}", sub


def test_every_help_is_plain_words_with_each_default_once():
    seen = 0
    for name, ap in _all_parsers():
        text = ap.format_help()
        seen += 1
        assert "``" not in text and not re.search(r":(mod|func|class):`", text), name
        assert "['" not in text and "('" not in text, (name, "a Python list/tuple repr in the help")
        for a in ap._actions:
            h = a.help or ""
            if h == argparse.SUPPRESS:
                continue
            assert len(re.findall(r"default:|\(default\b", h.lower())) <= 1, (name, a.option_strings, h)
            assert "%(default)" not in h
    assert seen >= 5 + 15 + 3


def _visible(ap) -> set[str]:
    return {o for a in ap._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def test_the_same_flags_for_the_same_ideas():
    """--out for what a command writes, --json wherever it prints a result, --format markdown|csv|json for tables."""
    leaves = {name: ap for name, ap in _all_parsers() if " " in name}
    assert {"finetune train", "finetune merge", "eval generate", "eval run", "probes ppl", "data pack"} <= set(leaves)
    for name, ap in leaves.items():
        opts = _visible(ap)
        assert "--json" in opts, name
        if name not in ("eval score", "data stats", "rope describe"):  # these write nothing (score: into --pred)
            assert "--out" in opts, name
        assert not opts & {"--output-dir", "--report-dir", "--min", "--max"}, name
    for name in ("eval report", "probes report"):
        assert {"--format", "--json", "--out", "--plot"} <= _visible(leaves[name])


@pytest.mark.parametrize("argv,check", [
    (["finetune", "--output-dir", "X", "--model", "/m"], lambda s: s.out == "X"),
    (["data", "pack", "--pairs", "p", "--out", "o", "--min", "10", "--max", "20"],
     lambda s: (s.min_tokens, s.max_tokens) == (10, 20)),
    (["data", "pack", "--pairs", "p", "--out", "o", "--min-tokens", "10", "--max-tokens", "20"],
     lambda s: (s.min_tokens, s.max_tokens) == (10, 20)),
    (["eval", "generate", "--no-cuda-graph", "--data", "d", "--prompt", "ie", "--out", "o"],
     lambda s: s.backend.cuda_graph is False),
])
def test_old_spellings_still_work(argv, check):
    tool = _tools()[argv[0]]
    ap = tool.parser()
    args = ap.parse_args(argv[1:] if argv[0] != "finetune" else ["train", *argv[1:]])
    if argv[0] == "finetune":
        from ropescale.training.config import settings_from_args

        settings = settings_from_args(args)[0]
    else:  # data pack, eval generate: defaults < --recipe < flags, the one way (common.settings.from_args)
        from ropescale.common.settings import from_args

        settings = from_args(args)
    assert check(settings)
    command = "train" if argv[0] == "finetune" else argv[1]
    assert argv[0] == "eval" or "old spellings still accepted" in _subparsers(ap)[command].format_help()


# ---------------------------------------------------------------- issue 26.6: one CLI style, finished
ENTRIES = [  # (how the tool is started, its main(argv, prog), the program its help must name)
    ("finetune.py", "ropescale.training.cli", "finetune.py"),
    ("eval_summ.py", "ropescale.evaluation.cli", "eval_summ.py"),
    ("python -m data_concat", "data_concat.cli", "python -m data_concat"),
    ("python -m rope_scaling", "rope_scaling.__main__", "python -m rope_scaling"),
    ("python -m ropescale.probes", "ropescale.probes.cli", "ropescale probes"),
    ("python -m rope_scaling describe", "rope_scaling.describe", "python -m rope_scaling describe"),
    ("python -m ropescale.training.memory.estimate", "ropescale.training.memory.estimate",
     "python -m ropescale.training.memory.estimate"),
    ("python -m ropescale.training.memory", "ropescale.training.memory.__main__",
     "python -m ropescale.training.memory"),
]


def _help(main, argv, capsys, **kw) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv, **kw)
    assert e.value.code == 0, argv
    out = capsys.readouterr().out
    return out


@pytest.mark.parametrize("entry,module,prog", ENTRIES)
def test_every_help_exits_0_and_names_its_own_program(entry, module, prog, capsys):
    import importlib

    main = importlib.import_module(module).main
    text = _help(main, ["--help"], capsys, prog=prog)
    assert text.startswith(f"usage: {prog} "), (entry, text[:80])
    ap = importlib.import_module(module).TOOL.parser(prog)
    for name in _subparsers(ap):
        text = _help(main, [name, "--help"], capsys, prog=prog)
        assert text.startswith(f"usage: {prog} {name} "), (entry, name, text[:80])


def test_the_front_door_names_each_tool_as_called(capsys):
    """``ropescale TOOL --help`` names ``ropescale TOOL`` (make-tiny's own parser named another program)."""
    from ropescale.cli import TOOLS, main

    for name in TOOLS:
        assert _help(main, [name, "--help"], capsys).startswith(f"usage: ropescale {name} "), name


def test_handlers_are_named_one_way():
    """A command's handler is ``cmd_<name>(args)``; ``main(argv)`` is only a tool's entry point."""
    for name, ap in _all_parsers():
        func = ap._defaults.get("func")
        if func is not None:
            assert func.__name__.startswith("cmd_"), (name, func.__name__)


def _choices(a: argparse.Action):
    spec = getattr(a, "spec", None)
    return a.choices or (spec.meta.choices if spec is not None else None)


def test_choices_print_one_way():
    """Choices print as argparse's {a,b}; never as a|b."""
    seen = 0
    for name, ap in _all_parsers():
        for a in ap._actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
                continue
            mv = a.metavar
            assert not (isinstance(mv, str) and re.fullmatch(r"[a-z0-9_.-]+(\|[a-z0-9_.-]+)+", mv)), (name, mv)
            if _choices(a) and mv not in (None, "METHOD"):  # --rope METHOD lists its methods in its help
                assert mv.startswith("{") and mv.endswith("}"), (name, a.option_strings, mv)
                seen += 1
    assert seen >= 10
    usage = _subparsers(_tools()["eval"].parser())["generate"].format_usage()
    assert "--prompt {ie,ib,ft-ie,ft-ib}" in usage, usage


@pytest.mark.parametrize("tool,argv,flags", [
    ("eval", ["generate"], ["--data", "--prompt", "--out"]),
    ("finetune", ["merge", "--out", "x"], ["--run"]),
    ("probes", ["ppl"], ["--out"]),
    ("data", ["pack", "--out", "x"], ["--pairs"]),
    ("data", ["sample", "--subset", "L", "--out", "x"], ["--chapters"]),
])
def test_a_missing_required_flag_is_argparses_error(tool, argv, flags, capsys):
    """Required flags show as required in the usage; a missing one is argparse's one message and exit code 2,
    whether argparse itself or a stage's settings (which a recipe may give) find it missing."""
    t = _tools()[tool]
    sub = _subparsers(t.parser())[argv[0]]
    usage = sub.format_usage()
    for f in flags:
        assert re.search(rf"(^|\s){f} ", usage) and f"[{f} " not in usage, (f, usage)
    with pytest.raises(SystemExit) as e:
        t.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: ") and f"error: the following arguments are required: {', '.join(flags)}" in err, err


def test_a_recipe_may_give_the_required_settings(tmp_path):
    from ropescale.common.settings import MissingSettings, from_args

    ap = _subparsers(_tools()["eval"].parser())["generate"]
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: d.jsonl\nprompt: ie\n", encoding="utf-8")
    s = from_args(ap.parse_args(["--recipe", str(recipe), "--out", "o"]))
    assert (s.data, s.prompt, s.out) == ("d.jsonl", "ie", "o")
    with pytest.raises(MissingSettings, match="required: --out$"):
        from_args(ap.parse_args(["--recipe", str(recipe)]))


def test_dtype_takes_one_vocabulary_everywhere():
    from ropescale.common.cli import DTYPES

    dtypes = {}
    for name, ap in _all_parsers():
        for a in ap._actions:
            if "--dtype" in a.option_strings:
                dtypes[name] = a
                assert a.metavar == "{" + ",".join(DTYPES) + "}", (name, a.metavar)
                base = [x for r in ap._actions if r.required for x in (r.option_strings[0], "x")]
                assert ap.parse_known_args(base + ["--dtype", "float32"])[0].dtype == "fp32", name
                assert ap.parse_known_args(base + ["--dtype", "BF16"])[0].dtype == "bf16", name
                with pytest.raises(SystemExit):
                    ap.parse_known_args(base + ["--dtype", "double"])
    assert {"finetune train", "finetune merge", "eval generate", "eval run"} <= set(dtypes), sorted(dtypes)
    assert DTYPES == ("auto", "bf16", "fp16", "fp32")


def test_report_format_md_and_describe_base_are_accepted():
    from rope_scaling.describe import build_parser as describe_parser
    from ropescale.evaluation.cli import build_parser

    assert build_parser().parse_args(["report", "--format", "md"]).format == "markdown"
    assert build_parser().parse_args(["report", "--json"]).format == "json"
    assert describe_parser().parse_args(["--base", "1e4"]).base == 1e4
    assert describe_parser().parse_args(["--rope-theta", "1e4"]).base == 1e4


def _imports(path: Path, mod: str) -> set[str]:
    """Project modules ``mod`` imports anywhere in its file (function bodies and TYPE_CHECKING blocks too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in PACKAGES}
    return out


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            rel = f.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            modules[name] = f
    graph = {m: {i for i in _imports(f, m) if i in modules and i != m} for m, f in modules.items()}
    # a package's __init__ that only re-exports its own modules is not an edge back up (x.y -> x)
    return {m: {i for i in deps if not m.startswith(i + ".")} for m, deps in graph.items()}


# The floors, bottom up (issue 26): a module may import its own room and rooms on lower floors, never higher ones.
LAYERS = (("ropescale", "ropescale.common"),  # the floor: files, settings, records, prompts, metric, where a model is
          ("rope_scaling",),
          ("data_concat",),
          ("ropescale.training", "ropescale.evaluation", "ropescale.probes", "ropescale.tiny"),  # stages, builder
          ("ropescale.demo", "ropescale.commands"),  # the end-to-end demo (scripts/demo.py); the stages' tools by name
          ("ropescale.experiments",),  # a study file's arms: the stages' commands, by name
          ("ropescale.cli", "ropescale.__main__", "rope_scaling.__main__"))  # the front door: only dispatches


def _room(module: str) -> str:
    return max((r for layer in LAYERS for r in layer if module == r or module.startswith(r + ".")), key=len)


def _floor(room: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if room in layer)


def test_imports_only_go_down_the_floors():
    graph = _module_graph()
    up = sorted(f"{m} -> {i}" for m, deps in graph.items() for i in deps
                if _floor(_room(i)) > _floor(_room(m)))
    assert up == [], up
    # rooms on the same floor do not lean on each other both ways
    rooms = {}
    for m, deps in graph.items():
        rooms.setdefault(_room(m), set()).update(_room(i) for i in deps if _room(i) != _room(m))
    both = sorted(f"{a} <-> {b}" for a in rooms for b in rooms[a] if a in rooms.get(b, ()) and a < b)
    assert both == [], both


def test_no_import_circles():
    graph = _module_graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    assert cycles == [], cycles


def test_pyproject_installs_the_command_without_touching_torch():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    deps = meta["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"^(torch|deepspeed|vllm|flash-attn)\b", d)], deps
    assert meta["project"]["scripts"]["ropescale"] == "ropescale.cli:main"
    r = subprocess.run([sys.executable, "-m", "ropescale", "--help"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0 and all(t in r.stdout for t in ("rope", "data", "finetune", "eval", "probes",
                                                             "make-tiny"))
    r = subprocess.run([sys.executable, "-m", "ropescale", "rope", "describe", "--preset", "yi-6b", "--rope", "yarn",
                        "--scale", "16", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == {"extrapolated": 13, "mixed": 14, "interpolated": 37}


def test_every_entry_point_prepares_the_process_through_one_function():
    """The CUDA allocator setting and the quieted libraries have one home (common.process.prepare_process, or
    common.process.setup_env which calls the same allocator function); every entry point calls it before importing
    torch, and no file sets the allocator variable itself."""
    entries = [ROOT / "finetune.py", ROOT / "eval_summ.py", ROOT / "ropescale" / "cli.py",
               ROOT / "ropescale" / "probes" / "__main__.py", ROOT / "data_concat" / "__main__.py",
               *sorted((ROOT / "bench").glob("*.py"))]
    for f in entries:
        text = f.read_text(encoding="utf-8")
        assert "prepare_process()" in text, f
    ours = [f for f in ROOT.rglob("*.py")  # the project's files: no hidden folder (.venv, .cache's venvs), no tests
            if not any(p.startswith(".") or p in ("tests", "runs") for p in f.relative_to(ROOT).parts)]
    setters = [str(f.relative_to(ROOT)) for f in ours if "expandable_segments" in f.read_text(encoding="utf-8")]
    assert setters == ["ropescale/common/process.py"], setters


def test_prepare_process_sets_the_allocator_only_with_cuda():
    from ropescale.common.process import ALLOC_CONF, set_cuda_allocator

    env = {}
    assert set_cuda_allocator(env, cuda=True) == ({"PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF}, True)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env = {}
    assert set_cuda_allocator(env, cuda=False) == ({}, False) and env == {}
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}  # the user's choice, under the newer name
    assert set_cuda_allocator(env, cuda=True) == ({}, True) and env == {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}
