"""The keys of what flashtune stores on a study and on its trials (Optuna user and system attributes).

Each key is defined here once; every reader and writer, in this package and outside it, names the
constant, never the string.

Study user attributes, set once at creation (``MADE_BY`` last, so a study that has it is complete):
    ``FAMILY``        kernel family name
    ``PROBLEM``       :class:`~tuner.problem.Problem` as a dict
    ``GPU``           what the GPU worker reported (name, arch, driver, clocks, ...)
    ``SPACE_DIGEST``  hash of the space file's knob declarations
    ``KERNEL``        {"origin", "source_digest"}: where the family came from ("package" or its kernel
                      directory) and the hash of its sources (``Space.source_digest``)
    ``KNOB_ENCODING`` how the knobs are stored (``"steps"``: ordered knobs as integers; absent in
                      older studies, whose knobs are all categorical: :mod:`tuner.study._knobs`)
    ``MADE_BY``       {"version", "schema"} of the tuner that created the study
and later:
    ``RUN``           how the study is tuned (sampler, seed, trial target)
    ``WINNER``        the re-timed best config (see :mod:`tuner.run`'s re-timing)
    ``WARM_START``    the studies whose winners were enqueued into it (written once)
    ``THROUGHPUT_PREFIX`` + ``<host>:<pid>:<start>``  each tuning run's statistics (``tuner.run.RunStats``)

Trial user attributes: ``STATUS`` (a :class:`tuner.outcome.Status`), ``REASON``, ``CONFIG_KEY``,
``IS_DEFAULT``, ``EXPLORATION``, ``RESOURCES``, ``COMPILE``, ``MEASUREMENT``, ``DUPLICATE_OF``,
``WARM_START`` (the study whose winner it was enqueued from) and, on a config enqueued again,
``REQUEUED_FROM``, ``REQUEUE_COUNT``, ``REQUEUE_REASON``. Trial system attribute: ``OWNER``.
"""

from __future__ import annotations

from ..outcome import STATUS_ATTR

__all__ = [
    "COMPILE",
    "CONFIG_KEY",
    "DUPLICATE_OF",
    "EXPLORATION",
    "FAMILY",
    "GPU",
    "IS_DEFAULT",
    "KERNEL",
    "KNOB_ENCODING",
    "MADE_BY",
    "MEASUREMENT",
    "OWNER",
    "PROBLEM",
    "REASON",
    "REQUEUED_FROM",
    "REQUEUE_COUNT",
    "REQUEUE_REASON",
    "RESOURCES",
    "RUN",
    "SPACE_DIGEST",
    "STATUS",
    "THROUGHPUT_PREFIX",
    "WARM_START",
    "WINNER",
]

# -- study user attributes -------------------------------------------------------------------
MADE_BY = "flashtune"
FAMILY = "family"
PROBLEM = "problem"
GPU = "gpu"
SPACE_DIGEST = "space_digest"
KERNEL = "kernel"
KNOB_ENCODING = "knob_encoding"
RUN = "run"
WINNER = "winner"
#: study: the studies whose winners were enqueued (once); trial: the study its config came from
WARM_START = "warm_start"
#: the prefix of the study user attribute each tuning run writes its statistics to
THROUGHPUT_PREFIX = "throughput:"

# -- trial user attributes -------------------------------------------------------------------
STATUS = STATUS_ATTR  # a tuner.outcome.Status
REASON = "reason"  # one line for people
IS_DEFAULT = "is_default"
CONFIG_KEY = "config_key"
RESOURCES = "resources"  # ptxas: registers, spills, stack, static smem
MEASUREMENT = "measurement"  # latency_ms, spread, reps, tflops, rel_error, lse_error
COMPILE = "compile"  # seconds, cached, arch
DUPLICATE_OF = "duplicate_of"
EXPLORATION = "exploration"  # drawn at random by the tuner because the search had no config to offer
REQUEUED_FROM = "requeued_from"  # the number of the trial whose config this one runs again
REQUEUE_COUNT = "requeue_count"  # how often the config was enqueued again after losing its worker
REQUEUE_REASON = "requeue_reason"

# -- trial system attributes -----------------------------------------------------------------
OWNER = "flashtune_owner"  # {"host", "boot_id", "pid", "started"} of the process holding the trial
