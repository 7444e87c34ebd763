"""The RoPE flags every CLI takes, built from RopeSpec's fields (``ropescale.common.settings``)."""
from __future__ import annotations

import argparse
import sys

from ropescale.common.settings import add_arguments, build, given

from .formulas import range_warning
from .spec import RopeSpec

_WARNED: set[str] = set()  # the settings warned about in this process (one line each)


def add_rope_args(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """Add --rope --scale --rope-base --orig-ctx --yarn-alpha --yarn-beta --yarn-mscale --replace
    --llama3-low-freq-factor --llama3-high-freq-factor --longrope-factors (RopeSpec's fields)."""
    return add_arguments(parser, RopeSpec, suppress_defaults=suppress_defaults)


def spec_from_args(args: argparse.Namespace) -> RopeSpec:
    """The RopeSpec the parsed flags describe (InputError on a bad combination); past its method's published range,
    one warning line on stderr (:func:`warn_range`)."""
    spec = build(RopeSpec, given(args, RopeSpec))
    warn_range(spec)
    return spec


def warn_range(spec: RopeSpec) -> None:
    """One line on stderr, once per setting in a process, when ``spec`` asks for more than its method's sources
    report (``formulas.range_warning``: e.g. yarn past x32)."""
    w = range_warning(spec)
    if w and spec.label() not in _WARNED:
        _WARNED.add(spec.label())
        print(w, file=sys.stderr)
