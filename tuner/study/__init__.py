"""TODO tuner.study."""

from ._heartbeat import HEARTBEAT_INTERVAL_S, Heartbeat, OWNER, REQUEUE_COUNT, owner_alive, recover_stale, requeue_stale, this_process
from ._meta import ChosenConfig, DUPLICATE_OF, IS_DEFAULT, MEASUREMENT, RESOURCES, STATUS, StudyError, StudyMeta, TrialStatus, choose, describe, load_flashtune_study, open_study, winner
from ._outcomes import finish, finish_duplicate, finished, stop_cleanly
from ._storage import DEFAULT_STORAGE, StorageError, check_storage, error_reason, mask_url, open_storage, reading, redact, retrying
from ._suite import Suite, SuiteError, describe_problem, is_finished, load_suite, select_studies, suite_storage, suite_studies
from ._trial_writes import TrialRef, create_running_trial, finish_trial

__all__ = ['ChosenConfig', 'DEFAULT_STORAGE', 'DUPLICATE_OF', 'HEARTBEAT_INTERVAL_S', 'Heartbeat', 'IS_DEFAULT', 'MEASUREMENT', 'OWNER', 'REQUEUE_COUNT', 'RESOURCES', 'STATUS', 'StorageError', 'StudyError', 'StudyMeta', 'Suite', 'SuiteError', 'TrialRef', 'TrialStatus', 'check_storage', 'choose', 'create_running_trial', 'describe', 'describe_problem', 'error_reason', 'finish', 'finish_duplicate', 'finish_trial', 'finished', 'is_finished', 'load_flashtune_study', 'load_suite', 'mask_url', 'open_storage', 'open_study', 'owner_alive', 'reading', 'recover_stale', 'redact', 'requeue_stale', 'retrying', 'select_studies', 'stop_cleanly', 'suite_storage', 'suite_studies', 'this_process', 'winner']
