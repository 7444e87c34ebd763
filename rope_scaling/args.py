"""The RoPE flags every CLI takes, built from RopeSpec's fields (``ropescale.common.settings``)."""
from __future__ import annotations

import argparse

from ropescale.common.settings import add_arguments, build, given

from .spec import RopeSpec


def add_rope_args(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """Add --rope --scale --rope-base --orig-ctx --yarn-alpha --yarn-beta --yarn-mscale --replace
    --llama3-low-freq-factor --llama3-high-freq-factor --longrope-factors (RopeSpec's fields)."""
    return add_arguments(parser, RopeSpec, suppress_defaults=suppress_defaults)


def spec_from_args(args: argparse.Namespace) -> RopeSpec:
    """The RopeSpec the parsed flags describe (InputError on a bad combination)."""
    return build(RopeSpec, given(args, RopeSpec))
