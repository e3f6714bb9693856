"""Heartbeats for the trials a tuning process holds, and recovery of trials whose process died.

Optuna only beats for trials run by ``study.optimize``; flashtune runs ask/tell, so it keeps
its own beat: a thread records, through the storage (database server time), a heartbeat for
every trial this process has asked and not yet told. Any live tuner then calls
:func:`recover_stale` now and then: a RUNNING trial whose beat is older than the grace
period belonged to a process that is gone (killed, host lost), so it is failed and its config
is enqueued again, with the reason, unless it already failed that way twice (a config that
keeps taking its worker down should not do so forever).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from datetime import datetime, timedelta

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from .study import EXPLORATION, IS_DEFAULT

__all__ = ["HEARTBEAT_INTERVAL_S", "GRACE_PERIOD_S", "MAX_REQUEUES", "Heartbeat", "recover_stale", "requeue_stale"]



def _seconds_from_env(name: str, default: int) -> int:
    """Whole seconds (Optuna's heartbeat takes integers; 2.5 becomes 3) from ``name``, else ``default``."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = math.ceil(float(text))
    except ValueError:
        value = 0
    if value < 1:
        warnings.warn(f"{name}={text!r} is not a positive number of seconds; using {default}", stacklevel=2)
        return default
    return value


# seconds; the environment may shorten them (tests, impatient clusters)
HEARTBEAT_INTERVAL_S = _seconds_from_env("FLASHTUNE_HEARTBEAT_INTERVAL_S", 10)
GRACE_PERIOD_S = _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60)
MAX_REQUEUES = 2

REQUEUED_FROM = "requeued_from"
REQUEUE_COUNT = "requeue_count"
REQUEUE_REASON = "requeue_reason"


def requeue_stale(study: optuna.Study, trial: FrozenTrial) -> None:
    """Storage callback for a trial just failed as stale: enqueue its config again, with the reason."""
    count = int(trial.user_attrs.get(REQUEUE_COUNT, 0))
    # an enqueued config (the default, say) is known even when its worker died while drawing it
    params = trial.params if _all_knobs_drawn(study, trial.params) else trial.system_attrs.get("fixed_params")
    if count >= MAX_REQUEUES or not params or not _all_knobs_drawn(study, params):
        return  # a config that keeps killing its worker, or a sampled trial cut short while drawing: the sampler goes on
    grace = GRACE_PERIOD_S
    study.enqueue_trial(dict(params), user_attrs={
        REQUEUED_FROM: trial.number,
        REQUEUE_COUNT: count + 1,
        REQUEUE_REASON: f"trial {trial.number} lost its worker (no heartbeat for {grace} s)",
        **{k: v for k, v in trial.user_attrs.items() if k in (IS_DEFAULT, EXPLORATION)},
    }, skip_if_exists=False)


def _all_knobs_drawn(study: optuna.Study, params: dict | None) -> bool:
    from .space import SpaceError, load_space

    try:
        knobs = {k.name for k in load_space(study.user_attrs["family"]).knobs}
    except (KeyError, SpaceError):
        return False
    return bool(params) and knobs <= set(params)


def recover_stale(study: optuna.Study, knobs: frozenset[str] = frozenset()) -> int:
    """Fail RUNNING trials whose heartbeat is stale (the storage's callback re-enqueues them), and
    RUNNING trials that never got all their parameters (an ask cut short by a dead process or a
    storage error: they never beat) once older than the grace period. Returns the orphans failed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    cutoff = datetime.now() - timedelta(seconds=GRACE_PERIOD_S)
    orphans = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        complete = bool(t.params) and set(knobs) <= set(t.params)
        too_young = t.datetime_start is None or t.datetime_start >= cutoff
        if complete or too_young:
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "status", "orphaned")
            study._storage.set_trial_user_attr(t._trial_id, "reason", "its tuner stopped while asking for parameters")
            study.tell(t.number, state=TrialState.FAIL)
            orphans += 1
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
            pass  # another tuner got there first
    return orphans


class Heartbeat:
    """Beat for the trials this process holds, every ``interval_s`` seconds, on a daemon thread."""

    def __init__(self, storage: optuna.storages.BaseStorage, *, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.storage = storage
        self.interval_s = interval_s
        self._held: dict[int, int] = {}  # trial number -> trial id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flashtune-heartbeat", daemon=True)
        self.errors = 0
        # the study's storage may be a caching wrapper around the RDBStorage; ask it, not its type
        self.enabled = bool(getattr(storage, "get_heartbeat_interval", lambda: None)())

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)

    def hold(self, trial: Trial) -> None:
        """Start beating for ``trial`` (beats once now, so a death right after ask is still noticed)."""
        with self._lock:
            self._held[trial.number] = trial._trial_id
        self._beat(trial._trial_id)

    def release(self, trial: Trial) -> None:
        with self._lock:
            self._held.pop(trial.number, None)

    def _beat(self, trial_id: int) -> None:
        if not self.enabled:
            return
        try:
            self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a missed beat is retried; a long outage makes the trial stale
            self.errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                ids = list(self._held.values())
            for trial_id in ids:
                self._beat(trial_id)
