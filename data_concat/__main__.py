"""python -m data_concat {pack,stats,pairs,sample} ..."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
