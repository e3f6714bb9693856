"""``flashtune ...`` with every ``--gpus`` lane on GPU 0: a stand-in for a host of several GPUs on a host of one.

    python -m tests.gpu.lanes_on_one_gpu LANES tune ... --gpus 0

The tuner refuses a GPU listed twice (two lanes on one GPU disturb each other's timings); this runs
the real CLI with ``--gpus`` read as LANES lanes on GPU 0, each with a GPU worker of its own. Used by
``python -m tests.gpu.bench_tuning --lanes 2`` to measure the loop's scaling from one lane to two
with real compiles and real measurements when no two-GPU machine is lent: on a 16-core host, one lane
with 7 compile workers against two lanes with 15 is half of, and all of, a two-GPU 32-core host.
The stored timings of such a run are not fit to tune on. Not collected by pytest.
"""

from __future__ import annotations

import sys

from tuner import cli
from tuner.cli import _gpus


def main(argv: list[str]) -> int:
    lanes = int(argv[0])
    if lanes < 1:
        raise SystemExit("LANES must be at least 1")
    _gpus.parse = lambda text: [0] * lanes  # the one change: --gpus means LANES lanes on GPU 0
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
