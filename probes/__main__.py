"""``python -m probes SUBCOMMAND ...`` (see probes.cli)."""
import sys

from common.cli import quiet_libraries

quiet_libraries()

from probes.cli import main  # noqa: E402

sys.exit(main())
