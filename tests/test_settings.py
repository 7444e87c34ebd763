"""ropescale.common.settings: one dataclass -> flags (each default once, old spellings hidden), recipe (file:line
errors), precedence (defaults < recipe < flags), run.json record and resume diff; the RoPE spec nested and
flattened."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from rope_scaling import RopeSpec
from ropescale.common.io import InputError
from ropescale.common.runs.resume import settings_diff as diff
from ropescale.common.settings import (
    add_arguments,
    build,
    from_record,
    given,
    nested,
    read_recipe,
    resolve,
    setting,
    to_record,
)


@dataclasses.dataclass(frozen=True)
class Toy:
    out: str | None = setting(None, "where it goes; default: ./toy", aliases=("--output-dir",), resume="ignore")
    steps: int = setting(10, "steps", check=(lambda v: v >= 1, ">= 1"), resume="grow")
    lr: float = setting(2e-5, "learning rate", check=(lambda v: v > 0, "> 0"))
    targets: list[str] = setting(["q", "k"], "modules")
    fast: bool = setting(True, "go fast", negative="--no-fast", resume="ignore")
    data: str | None = setting(None, "data directory", resume="path")
    rope: RopeSpec = nested(RopeSpec)


def _parser():
    return add_arguments(argparse.ArgumentParser(prog="toy"), Toy)


def test_flags_from_the_dataclass_each_default_once_aliases_hidden():
    help_text = " ".join(_parser().format_help().split())
    assert "(default: 10)" in help_text and "(default: 2e-05)" in help_text and "(default: q,k)" in help_text
    assert help_text.count("default") == help_text.count("(default:") + help_text.count("; default:")
    assert "--output-dir OUT" not in help_text and "old spellings still accepted: --output-dir (now --out)" in help_text
    for flag in ("--rope", "--scale", "--rope-base", "--yarn-mscale", "--replace"):
        assert flag in help_text
    assert "['q'" not in help_text and "``" not in help_text


def test_given_flags_override_the_recipe_over_the_defaults(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("steps: 7\nrope: pi\nscale: 4\ntargets: [a, b]\noutput_dir: there\n")
    ns = _parser().parse_args(["--scale", "8", "--output-dir", "here", "--no-fast"])
    s = resolve(Toy, given(ns, Toy), f)
    assert (s.steps, s.rope, s.targets, s.out, s.fast) == (7, RopeSpec("pi", 8), ["a", "b"], "here", False)
    assert resolve(Toy, given(_parser().parse_args([]), Toy)) == Toy()
    assert given(_parser().parse_args(["--fast", "false"]), Toy) == {"fast": False}


@pytest.mark.parametrize("text,line,words", [
    ("steps: 3\nsteps_per_epoch: 4\n", 2, ["unknown recipe key 'steps_per_epoch'"]),
    ("steps: 2.5\n", 1, ["'steps'", "integer"]),
    ("steps: 0\n", 1, ["'steps'", ">= 1", "got 0"]),
    ("lr: fast\n", 1, ["'lr'", "number"]),
    ("rope: bogus\n", 1, ["'rope'", "bogus", "ntk"]),
    ("fast: maybe\n", 1, ["'fast'", "true or false"]),
    ("lr: .nan\n", 1, ["'lr'", "finite"]),
])
def test_recipe_errors_name_file_and_line(tmp_path, text, line, words):
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        read_recipe(f, Toy)
    assert str(e.value).startswith(f"{f}:{line}: ")
    for w in words:
        assert w in str(e.value)


def test_checks_name_the_flag_and_rope_checks_run_on_build():
    with pytest.raises(InputError, match=r"^--steps must be >= 1, got 0$"):
        resolve(Toy, {"steps": 0})
    with pytest.raises(InputError, match="--rope abf needs --rope-base"):
        build(Toy, {"rope": "abf"})


def test_record_roundtrip_and_older_flat_records():
    s = build(Toy, {"rope": "yarn", "scale": 16.0, "yarn_beta": 8.0, "steps": 3, "data": "d"})
    rec = json.loads(json.dumps(to_record(s)))
    assert rec["rope"] == "yarn" and rec["scale"] == 16 and rec["steps"] == 3 and rec["targets"] == ["q", "k"]
    assert from_record(Toy, rec) == s
    # the rope as a nested spec dict, unknown keys ignored
    assert from_record(Toy, {"rope": {"method": "yarn", "scale": 16, "yarn_beta": 8}, "steps": 3, "data": "d",
                             "seed": 1}) == s


def test_diff_follows_each_settings_resume_rule(tmp_path):
    old = build(Toy, {"steps": 5, "data": str(tmp_path / "d"), "out": "a"})
    assert diff(old, build(Toy, {"steps": 9, "data": f"{tmp_path}/./d", "out": "b", "fast": False})) == []
    assert diff(old, build(Toy, {"steps": 4, "data": str(tmp_path / "d"), "lr": 1e-4})) == \
        ["steps 5 -> 4", "lr 2e-05 -> 0.0001"]
    assert diff(old, build(Toy, {"steps": 5, "data": str(tmp_path / "e"), "rope": "pi", "scale": 2})) == \
        [f"data {tmp_path / 'd'} -> {tmp_path / 'e'}", "rope none -> pi", "scale 1 -> 2"]
    assert diff(old, build(Toy, {"lr": 1.0}), only={"steps"}) == []


def test_rope_spec_record_reader_takes_every_older_form():
    assert RopeSpec.from_record({"rope": "none"}) == RopeSpec() == RopeSpec.from_record(None)
    assert RopeSpec.from_record({"method": "pi", "scale": 8.0}) == RopeSpec("pi", 8.0)
    assert RopeSpec.from_record("ntk").method == "ntk"
    assert RopeSpec("ntk", 8).label() == "ntk x8" and RopeSpec("abf", rope_base=8e4).label() == "abf x1 base=8e4"


def test_a_list_of_numbers_from_a_flag_and_a_recipe(tmp_path):
    """``list[float]`` / ``list[int]`` settings read comma lists from a flag and lists from a recipe (a list of
    floats once fell through to the string reader and failed on every value, e.g. passkey's ``--depths``)."""
    from ropescale.common.settings import converter

    floats, _ = converter(list[float])
    assert floats("0.1,0.5") == [0.1, 0.5] and floats([0.25, "1e-1"]) == [0.25, 0.1]
    ints, optional = converter(list[int] | None)
    assert ints("512,1024") == [512, 1024] and optional
    with pytest.raises(ValueError):
        floats("0.1,x")
