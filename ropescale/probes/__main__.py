"""``python -m ropescale.probes SUBCOMMAND ...`` (= ``ropescale probes ...``) (see ropescale.probes.cli)."""
import sys

from ropescale.common.process import prepare_process

prepare_process()

from ropescale.probes.cli import main  # noqa: E402

sys.exit(main())
