"""``python -m probes SUBCOMMAND ...`` (see probes.cli)."""
import sys

from probes.cli import main

sys.exit(main())
