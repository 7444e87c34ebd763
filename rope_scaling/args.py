"""The one argparse helper every CLI uses for RoPE flags."""
from __future__ import annotations

import argparse

from .spec import METHODS, RopeSpec


def add_rope_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add --rope --scale --rope-base --orig-ctx --yarn-alpha --yarn-beta --yarn-mscale --replace."""
    g = parser.add_argument_group("RoPE scaling (written into the model config as plain transformers entries)")
    g.add_argument("--rope", choices=METHODS, default="none",
                   help="none: unchanged; pi: position interpolation (positions / s); ntk: static NTK-aware "
                        "(base * s^(d/(d-2))); dynamic_ntk: NTK base recomputed from the current length "
                        "(transformers 'dynamic'); yarn: NTK-by-parts + attention temperature; abf: a new base "
                        "(--rope-base). Default: %(default)s")
    g.add_argument("--scale", type=float, default=1.0, metavar="S",
                   help="context extension factor s >= 1: target context = orig-ctx * s (default %(default)s)")
    g.add_argument("--rope-base", type=float, default=None, metavar="B",
                   help="new RoPE base (ABF). Required for --rope abf; with another method the base is replaced "
                        "first, then the method applies")
    g.add_argument("--orig-ctx", type=int, default=None, metavar="N",
                   help="original (pre-training) context; default: the config's original_max_position_embeddings, "
                        "else max_position_embeddings")
    g.add_argument("--yarn-alpha", type=float, default=1.0, metavar="A",
                   help="YaRN alpha = beta_slow: dims turning fewer than A times over orig-ctx are fully "
                        "interpolated (default %(default)s)")
    g.add_argument("--yarn-beta", type=float, default=32.0, metavar="B",
                   help="YaRN beta = beta_fast: dims turning more than B times are left unchanged "
                        "(default %(default)s)")
    g.add_argument("--yarn-mscale", type=float, default=None, metavar="M",
                   help="YaRN attention factor on cos/sin (default 0.1*ln(s)+1)")
    g.add_argument("--replace", action="store_true",
                   help="replace RoPE scaling the model already carries (e.g. Llama-3.x 'llama3') instead of "
                        "refusing to stack a second method")
    return parser


def spec_from_args(args: argparse.Namespace) -> RopeSpec:
    """The RopeSpec the parsed flags describe (InputError on a bad combination)."""
    return RopeSpec(method=args.rope, scale=args.scale, rope_base=args.rope_base, orig_ctx=args.orig_ctx,
                    yarn_alpha=args.yarn_alpha, yarn_beta=args.yarn_beta, yarn_mscale=args.yarn_mscale,
                    replace=args.replace)
