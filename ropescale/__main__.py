"""python -m ropescale make-tiny ..."""
import sys

from common.io import cli_main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m ropescale make-tiny [--out DIR] [--steps N] [--force]\n\n"
              "  make-tiny   build (or show) the embedded tiny default model", file=sys.stderr)
        return 0 if argv else 2
    if argv[0] == "make-tiny":
        from .tiny import main as tiny_main

        return tiny_main(argv[1:])
    print(f"unknown command {argv[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(cli_main(main)())
