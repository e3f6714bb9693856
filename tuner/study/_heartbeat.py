"""Heartbeats for the trials a tuning process holds, and recovery of trials whose process died.

Optuna only beats for trials run by ``study.optimize``; flashtune runs ask/tell, so it keeps
its own beat: a thread records, through the storage (database server time), a heartbeat for
every trial this process has asked and not yet told, and the trial records which process
holds it (:data:`OWNER`). Any live tuner then calls :func:`recover_stale` now and then: a
RUNNING trial whose beat is older than the grace period belonged to a process that is gone
(killed, host lost), so it is failed and the storage's stale-trial callback runs (flashtune's:
:func:`requeue_stale`, which enqueues its config again unless it already failed that way
twice: a config that keeps taking its worker down should not do so forever).

A trial is never failed while its owner is alive: a late beat (a busy database, a heartbeat
write queued behind other tuners' transactions) is not a dead tuner. Where the owner runs on
the same host as the recovering tuner, the process itself is asked; elsewhere the beat is
all there is to go by.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import threading
import warnings
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..errors import warn
from ._attributes import EXPLORATION, IS_DEFAULT, OWNER, REASON, REQUEUE_COUNT, REQUEUE_REASON, REQUEUED_FROM, STATUS
from ._meta import StudyError, StudyMeta, TrialStatus
from ._optuna_storage import enqueued_config, flashtune_storage, study_id_of, study_storage, trial_id_of

__all__ = [
    "GRACE_PERIOD_S",
    "HEARTBEAT_INTERVAL_S",
    "MAX_REQUEUES",
    "Heartbeat",
    "owner_alive",
    "recover_stale",
    "requeue_stale",
    "this_process",
]


def _seconds_from_env(name: str, default: int) -> int:
    """Whole seconds (Optuna's heartbeat takes integers; 2.5 becomes 3) from ``name``, else ``default``."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = math.ceil(float(text))
    except (ValueError, OverflowError):  # "soon", "nan", "inf"
        value = 0
    if not 1 <= value <= 86400:
        warn(f"{name}={text!r} is not a whole number of seconds from 1 to 86400; using {default}")
        return default
    return value


# seconds; the environment may shorten them (tests, impatient clusters)
HEARTBEAT_INTERVAL_S = _seconds_from_env("FLASHTUNE_HEARTBEAT_INTERVAL_S", 10)
GRACE_PERIOD_S = _seconds_from_env("FLASHTUNE_GRACE_PERIOD_S", 60)
MAX_REQUEUES = 2
#: a trial with no beat at all (its tuner died between asking and the first beat) is failed this much later
#: than a stale one: the first beat may wait behind other tuners' writes
ORPHAN_AFTER_S = 2 * GRACE_PERIOD_S
#: a trial whose owner is alive on this host but has stopped beating (its tuning loop ended without
#: storing it) is failed only after this long
LIVE_OWNER_GRACE_S = max(10 * GRACE_PERIOD_S, 600)


# -- who holds a trial -------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux), to tell it from a later one with its pid."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of the whole line


@lru_cache(maxsize=1)
def _host() -> dict[str, str]:
    return {"host": socket.gethostname(), "boot_id": _read("/proc/sys/kernel/random/boot_id") or ""}


def this_process() -> dict[str, Any]:
    """The owner record of the calling process."""
    return {**_host(), "pid": os.getpid(), "started": _process_start(os.getpid())}


def owner_alive(owner: Any) -> bool | None:
    """True if the process of an owner record is alive (the same process, not a later one with its pid),
    False if it is gone, None when this host cannot tell (the owner runs elsewhere, or no record)."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return None
    if {k: owner.get(k) for k in ("host", "boot_id")} != _host() or not _host()["boot_id"]:
        return None
    started = _process_start(owner["pid"])
    if started is None:
        return False
    return owner.get("started") is None or started == owner.get("started")


# -- recovery ----------------------------------------------------------------------------------
def requeue_stale(study: optuna.Study, trial: FrozenTrial) -> None:
    """Storage callback for a trial just failed as stale: enqueue its config again, with the reason."""
    count = trial.user_attrs.get(REQUEUE_COUNT, 0)
    count = count if isinstance(count, int) and not isinstance(count, bool) else MAX_REQUEUES
    # an enqueued config (the default, say) is known even when its worker died while drawing it
    params = trial.params if _all_knobs_drawn(study, trial.params) else enqueued_config(trial)
    if count >= MAX_REQUEUES or not params or not _all_knobs_drawn(study, params):
        return  # a config that keeps killing its worker, or a sampled trial cut short while drawing: the sampler goes on
    study.enqueue_trial(
        dict(params),
        user_attrs={
            REQUEUED_FROM: trial.number,
            REQUEUE_COUNT: count + 1,
            REQUEUE_REASON: f"trial {trial.number} lost its worker (no heartbeat for {GRACE_PERIOD_S} s)",
            **{k: v for k, v in trial.user_attrs.items() if k in (IS_DEFAULT, EXPLORATION)},
        },
        skip_if_exists=False,
    )


def _all_knobs_drawn(study: optuna.Study, params: dict | None) -> bool:
    try:
        knobs = {k.name for k in StudyMeta.read(study).space().knobs}
    except StudyError:
        return False
    return bool(params) and isinstance(params, dict) and knobs <= set(params)


def _may_fail(trial: FrozenTrial, silent_for_s: float | None) -> bool:
    """Whether a trial that has not beaten for ``silent_for_s`` seconds (None: never) may be failed."""
    alive = owner_alive(trial.system_attrs.get(OWNER))
    if alive:
        return silent_for_s is not None and silent_for_s > LIVE_OWNER_GRACE_S
    return True


def _fail(study: optuna.Study, trial: FrozenTrial, attrs: dict[str, str]) -> bool:
    """Fail a RUNNING trial; False when another process finished it first."""
    storage = study_storage(study)
    try:
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id_of(trial), key, value)
        return bool(storage.set_trial_state_values(trial_id_of(trial), state=TrialState.FAIL))
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
        return False  # its owner stored it, or another tuner failed it first


def recover_stale(study: optuna.Study, knobs: frozenset[str] = frozenset()) -> int:
    """Fail the RUNNING trials of tuners that are gone; returns how many were failed.

    - a trial whose last beat is older than the grace period: failed, then the storage's stale-trial
      callback runs (:func:`requeue_stale` by default: its config is enqueued again);
    - a trial that never beat and never got all its parameters (``knobs``; its tuner died while asking),
      once older than :data:`ORPHAN_AFTER_S`: failed as orphaned.

    A trial whose owner is alive on this host is left alone (see :data:`LIVE_OWNER_GRACE_S`), and a
    trial that another tuner finished or failed first is skipped, never an error. A storage that is not
    flashtune's (:func:`tuner.study.open_storage` opens one) gets Optuna's own stale-trial check instead.
    """
    storage = study_storage(study)
    ours = flashtune_storage(storage)
    if ours is None:  # not flashtune's storage: Optuna's own check
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        return 0
    beats, now = ours.running_trial_beats(study_id_of(study))
    callback = getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
    cutoff = datetime.now() - timedelta(seconds=ORPHAN_AFTER_S)
    failed = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = beats.get(trial_id_of(t))
        if beat is not None:
            silent_s = (now - beat).total_seconds()
            if silent_s <= GRACE_PERIOD_S or not _may_fail(t, silent_s):
                continue
            if _fail(study, t, {}):
                failed += 1
                if callback is not None:
                    callback(study, copy.deepcopy(storage.get_trial(trial_id_of(t))))
            continue
        drawn = bool(t.params) and set(knobs) <= set(t.params)
        too_young = t.datetime_start is None or t.datetime_start >= cutoff
        if drawn or too_young or not _may_fail(t, None):
            continue
        if _fail(
            study, t, {STATUS: TrialStatus.ORPHANED.value, REASON: "its tuner stopped while asking for parameters"}
        ):
            failed += 1
    return failed


class Heartbeat:
    """Beat for the trials this process holds, every ``interval_s`` seconds, on a daemon thread."""

    def __init__(self, storage: optuna.storages.BaseStorage, *, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.storage = storage
        self.interval_s = interval_s
        self._held: set[int] = set()  # ids of the trials this process holds
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

    def hold(self, trial_id: int, *, recorded: bool = False) -> None:
        """Start beating for a trial: record this process as its owner and beat once now, so a death right
        after ask is still noticed and a live owner is never taken for a dead one. ``recorded``: the
        trial was created with its owner and first beat (:func:`tuner.study.create_running_trial`)."""
        with self._lock:
            self._held.add(trial_id)
        if not self.enabled or recorded:
            return
        try:
            self.storage.set_trial_system_attr(trial_id, OWNER, this_process())
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another tuner failed it already: the tuning loop finds out when it draws or stores
        except Exception:
            self.errors += 1
        self._beat(trial_id)

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._held.discard(trial_id)

    def _beat(self, trial_id: int) -> None:
        if not self.enabled:
            return
        try:
            self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        except Exception:
            self.errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                ids = list(self._held)
            for trial_id in ids:
                self._beat(trial_id)
