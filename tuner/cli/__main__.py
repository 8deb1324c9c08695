"""``python -m tuner.cli``: the ``nightshift`` command (what the Jobs API runs on a cluster's head)."""

import sys

from tuner.cli import main

sys.exit(main())
