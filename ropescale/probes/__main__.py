"""``python -m ropescale.probes SUBCOMMAND ...`` (= ``ropescale probes ...``) (see ropescale.probes.cli)."""
import sys

from ropescale.common.cli import quiet_libraries

quiet_libraries()

from ropescale.probes.cli import main  # noqa: E402

sys.exit(main())
