"""python -m data_concat {pack,stats,pairs,sample,recall} ..."""
import sys

from ropescale.common.process import prepare_process

prepare_process()

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
