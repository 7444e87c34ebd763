"""The house's shape, read from the source: no re-export-only facades, names used across modules are public, the
arrows of the floors that the import graph alone does not show, and where the memory work, the serving rules and the
slot decoder's rotary rules live. Every check walks the files (``ast``), none imports the modules it judges."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# where the project's code is, and the directory each tree's modules are named from (bench/ puts itself on sys.path)
TREES = (("ropescale", ROOT), ("rope_scaling", ROOT), ("data_concat", ROOT), ("bench", ROOT / "bench"),
         ("finetune.py", ROOT), ("eval_summ.py", ROOT))
# the two importable libraries' documented surface (``from rope_scaling import RopeSpec``): the only packages whose
# __init__ may be imports and __all__ alone
PUBLIC_APIS = ("rope_scaling/__init__.py", "data_concat/__init__.py")
MAX_PRIVATE_IMPORTS = 2


@cache
def modules() -> dict[str, tuple[Path, ast.Module]]:
    """Every project module by its dotted name (bench's as bench runs them: ``gpusuite.runner``)."""
    out = {}
    for tree, base in TREES:
        p = ROOT / tree
        for f in [p] if p.is_file() else sorted(p.rglob("*.py")):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = (f, ast.parse(f.read_text(encoding="utf-8"), str(f)))
    return out


def is_package(name: str) -> bool:
    return modules()[name][0].name == "__init__.py"


def absolute(name: str, node: ast.ImportFrom) -> str:
    """The module an ``import from`` in module ``name`` reads, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    base = parts if is_package(name) else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str):
    """(line, module imported) of every import in module ``name``, in functions too."""
    for node in ast.walk(modules()[name][1]):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            src = absolute(name, node)
            yield node.lineno, src
            yield from ((node.lineno, f"{src}.{a.name}") for a in node.names if f"{src}.{a.name}" in modules())


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ---------------------------------------------------------------- no facades, public names
def facade(tree: ast.Module) -> bool:
    """A module whose body (past its docstring) is only imports and an ``__all__``, and imports something."""
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]

    def is_all(n) -> bool:
        targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        return isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and \
            any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)

    imported = [n for n in body if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom)
                                                                  and n.module != "__future__")]
    return bool(imported) and all(isinstance(n, (ast.Import, ast.ImportFrom)) or is_all(n) for n in body)


def test_the_facade_rule_tells_a_facade_from_a_module():
    assert facade(ast.parse('"""doc"""\nfrom .a import x\nfrom .b import y\n__all__ = ["x", "y"]\n'))
    assert facade(ast.parse("from __future__ import annotations\nimport os\n"))
    assert not facade(ast.parse('"""doc only"""\n'))
    assert not facade(ast.parse("from .a import x\n\n\ndef f():\n    return x\n"))
    assert not facade(ast.parse("from .a import main\n\nif __name__ == '__main__':\n    main()\n"))


def test_no_module_only_re_exports():
    found = sorted(rel(f) for f, tree in modules().values() if facade(tree) and rel(f) not in PUBLIC_APIS)
    assert found == [], f"modules that only re-export (callers import the module that owns a name): {found}"


def test_the_run_package_is_its_doc():
    init = ROOT / "ropescale" / "common" / "runs" / "__init__.py"
    lines = init.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 30, f"{rel(init)}: {len(lines)} lines"
    tree = ast.parse("\n".join(lines))
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], "a re-export block"


def private_imports() -> list[str]:
    """Each private name (one leading underscore) one module takes from another: ``from m import _x`` and ``m._x``
    on an imported project module, as ``m._x <- importer:line``, one entry per (m, _x)."""
    found: dict[str, str] = {}

    def note(src: str, attr: str, name: str, line: int) -> None:
        if attr.startswith("_") and not attr.startswith("__") and src != name and src in modules():
            found.setdefault(f"{src}.{attr}", f"{modules()[name][0].relative_to(ROOT)}:{line}")

    for name, (_, tree) in modules().items():
        bound: dict[str, str] = {}  # local name -> the project module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = absolute(name, node)
                for a in node.names:
                    note(src, a.name, name, node.lineno)
                    if f"{src}.{a.name}" in modules():
                        bound[a.asname or a.name] = f"{src}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules():
                        bound[a.asname or a.name] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                note(bound[node.value.id], node.attr, name, node.lineno)
    return sorted(f"{k} <- {v}" for k, v in found.items())


def test_names_used_across_modules_are_public():
    found = private_imports()
    assert len(found) <= MAX_PRIVATE_IMPORTS, f"{len(found)} private names imported across modules: {found}"


def test_the_private_name_walk_sees_both_forms(tmp_path, monkeypatch):
    pkg = {"a": "def _x():\n    pass\n", "b": "from .a import _x, __doc__\n", "c": "from . import a\na._x()\n",
           "d": "from .a import _y\n"}  # d takes a name a does not define: still a private name of another module
    fake = {f"p.{k}": (tmp_path / f"{k}.py", ast.parse(v)) for k, v in pkg.items()}
    fake["p"] = (tmp_path / "__init__.py", ast.parse(""))
    monkeypatch.setattr(sys.modules[__name__], "modules", lambda: fake)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert private_imports() == ["p.a._x <- b.py:1", "p.a._y <- d.py:1"]


# ---------------------------------------------------------------- arrows the floors' test does not show
def test_training_imports_no_evaluation_module():
    up = sorted(f"{rel(modules()[m][0])}:{line} imports {i}" for m in modules() if m.startswith("ropescale.training")
                for line, i in imports(m) if i == "ropescale.evaluation" or i.startswith("ropescale.evaluation."))
    assert up == [], up


def test_rope_scaling_entry_reaches_search_without_the_ropescale_cli():
    entry = "rope_scaling.__main__"
    assert entry in modules()
    seen, todo = set(), [entry]  # its static closure over project modules
    while todo:
        m = todo.pop()
        for _, i in imports(m):
            mod = next((c for c in (i, i.rpartition(".")[0]) if c in modules()), None)
            if mod and mod not in seen:
                seen.add(mod)
                todo.append(mod)
    assert "ropescale.cli" not in seen and "ropescale.__main__" not in seen
    # and as it runs: the factor search's --help loads no ropescale.cli
    code = ("import runpy, sys, json\nsys.argv = ['rope_scaling', 'search', '--help']\ntry:\n"
            "    runpy.run_module('rope_scaling', run_name='__main__', alter_sys=True)\nexcept SystemExit:\n    pass\n"
            "sys.__stdout__.write('\\n' + json.dumps(sorted(m for m in sys.modules if m.startswith('ropescale'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.rsplit("\n", 1)[-1])
    assert "ropescale.probes.rope_search" in loaded and "ropescale.cli" not in loaded, loaded


def test_the_report_names_no_probe():
    intake = ROOT / "ropescale" / "evaluation" / "report" / "intake.py"
    probes = {"copy", "perturb", "suffix-id", "ppl", "shuffle", "passkey", "ruler"}
    named = sorted({n.value for n in ast.walk(ast.parse(intake.read_text(encoding="utf-8")))
                    if isinstance(n, ast.Constant) and n.value in probes})
    assert named == [], f"{rel(intake)} branches on probes {named}: each probe declares its variants"


# ---------------------------------------------------------------- where things live
def test_formulas_keep_the_math_not_the_serving_rules():
    formulas = ROOT / "rope_scaling" / "formulas.py"
    n = len(re.findall("vllm", formulas.read_text(encoding="utf-8"), flags=re.IGNORECASE))
    assert n <= 5, f"{rel(formulas)} mentions vLLM {n} times: the serving rules are evaluation/backends/vllm.py's"


def test_the_memory_work_is_one_package():
    training = ROOT / "ropescale" / "training"
    top = sorted(p.name for p in training.glob("*.py")
                 if p.stem in ("memory", "memory_model", "planner", "tiled_mlp", "offload"))
    assert top == [], f"memory modules at training's top level: {top}"
    assert (training / "memory" / "__init__.py").is_file(), "ropescale/training/memory/ is not a package"


def test_the_slot_decoder_rules_are_not_in_the_engine():
    """No ``_Slot*Rope`` class (nor any rotary rule: a class named ``*Rope*``), ``fixed_rope`` or ``slot_ropes``
    defined in the engine: the slot decoder's rotary rules live in their own module."""
    engine = ROOT / "ropescale" / "evaluation" / "engine.py"
    tree = ast.parse(engine.read_text(encoding="utf-8"))
    rules = sorted(n.name for n in ast.walk(tree) if (isinstance(n, ast.ClassDef) and "Rope" in n.name)
                   or (isinstance(n, ast.FunctionDef) and n.name in ("fixed_rope", "slot_ropes")))
    assert rules == [], f"{rel(engine)} defines {rules}"


ENV_TOOLS = {"setup.sh", "envbuild.py", "lock.py", "compat.py"}  # scripts/: the environment's tools
DEMO_ENTRY = {"demo.py", "demo.sh"}  # and the demo's thin entry points


def test_scripts_hold_the_environment_tools_and_a_thin_demo_entry_only():
    """A study is an experiment file (experiments/*.yaml, ``python -m ropescale.experiments``), never a script:
    scripts/ keeps the environment's tools and the demo's entry points (each <= 40 lines), and nothing there puts a
    directory on sys.path (a script's own directory is already first on it)."""
    files = {f.name: f for f in (ROOT / "scripts").iterdir() if f.is_file()}
    assert set(files) <= ENV_TOOLS | DEMO_ENTRY, sorted(set(files) - ENV_TOOLS - DEMO_ENTRY)
    for name in DEMO_ENTRY & set(files):
        n = len(files[name].read_text(encoding="utf-8").splitlines())
        assert n <= 40, f"scripts/{name}: {n} lines (an entry point: at most 40)"
    for name, f in files.items():
        assert "sys.path.insert" not in f.read_text(encoding="utf-8"), f"scripts/{name} edits sys.path"
    assert len(list((ROOT / "experiments").glob("*.yaml"))) >= 7
