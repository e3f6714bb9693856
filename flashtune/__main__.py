"""``python -m flashtune``: the ``flashtune`` command."""

import sys

from tuner.cli import main

sys.exit(main())
