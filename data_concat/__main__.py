"""python -m data_concat {pack,stats,pairs,sample,recall} ..."""
import sys

from ropescale.common.cli import quiet_libraries

quiet_libraries()

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
