"""Flashtune's Optuna studies: where tuning results are stored, and how they are read back.

- Storage: :func:`open_storage` opens a SQLAlchemy URL (default :data:`DEFAULT_STORAGE`) as a
  :class:`FlashtuneStorage`, after checking it is an Optuna database or a place to create one;
  :func:`retrying` rides out an unreachable database; :func:`mask_url` and :func:`redact` keep
  passwords out of every message.
- Studies: :func:`open_study` creates a study with its metadata (family, problem, GPU, space digest)
  or resumes one made for the same; :class:`StudyMeta` reads that metadata back, :func:`choose` the
  config a study may serve. The keys of every study and trial attribute are the constants here.
- Trials: the tuning loop creates and finishes trials in one short transaction each
  (:func:`create_running_trial`, :func:`finish`); :class:`Heartbeat` beats for the trials a process
  holds, and :func:`recover_stale` fails those whose process died and enqueues their configs again.
- Suites: :func:`load_suite` reads a TOML file naming the problems of one family to tune;
  :func:`model_shapes` reads a Hugging Face model's ``config.json`` into its attention problems, which
  :func:`model_suite_text` writes as a suite (``flashtune tune --model``).

Optuna's private storage names are used in one module only (``_optuna_storage``); other code reaches
a study's storage and a trial's id through :func:`study_storage` and :func:`trial_id_of`.
"""

from ._attributes import (
    COMPILE,
    CONFIG_KEY,
    DUPLICATE_OF,
    EXPLORATION,
    FAMILY,
    GPU,
    IS_DEFAULT,
    KERNEL,
    KNOB_ENCODING,
    MADE_BY,
    MEASUREMENT,
    OWNER,
    PROBLEM,
    REASON,
    REQUEUE_COUNT,
    REQUEUE_REASON,
    REQUEUED_FROM,
    RESOURCES,
    RUN,
    SPACE_DIGEST,
    STATUS,
    THROUGHPUT_PREFIX,
    WARM_START,
    WINNER,
)
from ._heartbeat import HEARTBEAT_INTERVAL_S, Heartbeat, owner_alive, recover_stale, requeue_stale, this_process
from ._knobs import knob_distribution, knob_distributions
from ._meta import (
    ChosenConfig,
    NotFlashtuneError,
    StaleSpaceError,
    StudyError,
    StudyInfo,
    StudyMeta,
    TrialStatus,
    choose,
    default_study_name,
    default_trial,
    describe,
    is_evaluated,
    listing_hint,
    load_flashtune_study,
    open_study,
    space_digest,
    study_problem,
    winner,
    winner_verdict,
)
from ._model import ModelError, ModelShapes, model_shapes, model_suite_text
from ._optuna_storage import FlashtuneStorage, pop_waiting_trial_id, study_storage, trial_id_of
from ._outcomes import finish, finish_duplicate, finished, stop_cleanly
from ._secrets import mask_url, redact
from ._storage import (
    DEFAULT_STORAGE,
    StorageError,
    check_storage,
    error_reason,
    open_storage,
    reading,
    retrying,
    sqlite_files,
)
from ._suite import (
    MAX_SUITE_PROBLEMS,
    Suite,
    SuiteError,
    SuiteStudy,
    describe_problem,
    is_finished,
    load_suite,
    select_studies,
    suite_storage,
    suite_studies,
)
from ._trial_writes import TrialRef, create_running_trial, finish_trial

__all__ = [
    # attribute keys
    "COMPILE",
    "CONFIG_KEY",
    # storage
    "DEFAULT_STORAGE",
    "DUPLICATE_OF",
    "EXPLORATION",
    "FAMILY",
    "GPU",
    # trials
    "HEARTBEAT_INTERVAL_S",
    "IS_DEFAULT",
    "KERNEL",
    "KNOB_ENCODING",
    "MADE_BY",
    "MAX_SUITE_PROBLEMS",
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
    # studies
    "ChosenConfig",
    "FlashtuneStorage",
    "Heartbeat",
    "ModelError",
    "ModelShapes",
    "NotFlashtuneError",
    "StaleSpaceError",
    "StorageError",
    "StudyError",
    "StudyInfo",
    "StudyMeta",
    # suites
    "Suite",
    "SuiteError",
    "SuiteStudy",
    "TrialRef",
    "TrialStatus",
    "check_storage",
    "choose",
    "create_running_trial",
    "default_study_name",
    "default_trial",
    "describe",
    "describe_problem",
    "error_reason",
    "finish",
    "finish_duplicate",
    "finish_trial",
    "finished",
    "is_evaluated",
    "is_finished",
    "knob_distribution",
    "knob_distributions",
    "listing_hint",
    "load_flashtune_study",
    "load_suite",
    "mask_url",
    "model_shapes",
    "model_suite_text",
    "open_storage",
    "open_study",
    "owner_alive",
    # what Optuna keeps private
    "pop_waiting_trial_id",
    "reading",
    "recover_stale",
    "redact",
    "requeue_stale",
    "retrying",
    "select_studies",
    "space_digest",
    "sqlite_files",
    "stop_cleanly",
    "study_problem",
    "study_storage",
    "suite_storage",
    "suite_studies",
    "this_process",
    "trial_id_of",
    "winner",
    "winner_verdict",
]
