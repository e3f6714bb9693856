"""The stand-in tuner (:mod:`tests.fakes.standin_tuner`) run as a ``flashtune`` command runs: inside the
command line's process handling (signals, standard streams) and its error handling, exit status and all.

    python -m tests.fakes.standin_command STORAGE STUDY N_TRIALS MEASURE_LOG [SLEEP_S]
"""

from __future__ import annotations

import argparse
import sys

from tests.fakes import standin_tuner
from tuner.cli._main import _run
from tuner.cli._process import command_process


def main(argv: list[str]) -> int:
    with command_process():
        return _run("tune", argparse.Namespace(func=lambda _args: standin_tuner.main(argv), verbose=0, quiet=0))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
