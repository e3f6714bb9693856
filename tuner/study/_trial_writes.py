"""The tuning loop's trial writes, one short transaction each: a new RUNNING trial with its knobs,
attributes, owner and first heartbeat; a measured trial with its attributes, state and value.

On flashtune's storage (:class:`~tuner.study.FlashtuneStorage`, what :func:`tuner.study.open_storage`
opens) each is one transaction of a handful of statements; any other storage (Optuna's in-memory one
of replay and tests, a plain RDB storage) gets the same trial through Optuna's public calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from ._optuna_storage import flashtune_storage, study_id_of, study_storage, trial_id_of

__all__ = ["TrialRef", "create_running_trial", "finish_trial"]


@dataclass(frozen=True)
class TrialRef:
    """A stored trial as the loop holds it: its number in the study and its storage id."""

    number: int
    trial_id: int

    @classmethod
    def of(cls, trial: optuna.trial.Trial | FrozenTrial) -> TrialRef:
        return cls(trial.number, trial_id_of(trial))


def create_running_trial(
    study: optuna.Study,
    params: Mapping[str, Any],
    dists: Mapping[str, BaseDistribution],
    *,
    user_attrs: Mapping[str, Any] | None = None,
    system_attrs: Mapping[str, Any] | None = None,
) -> TrialRef:
    """A new RUNNING trial holding ``params`` (each with its distribution), with its attributes and, where
    the storage keeps heartbeats, a first beat; numbered as Optuna numbers trials (the count of the
    study's earlier trials)."""
    user_attrs, system_attrs = dict(user_attrs or {}), dict(system_attrs or {})
    storage = study_storage(study)
    ours = flashtune_storage(storage)
    if ours is not None:
        number, new_id = ours.create_running_trial(
            study_id_of(study), params, dists, user_attrs=user_attrs, system_attrs=system_attrs
        )
        return TrialRef(number, new_id)
    template = FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        values=None,
        datetime_start=datetime.now(),
        datetime_complete=None,
        params=dict(params),
        distributions=dict(dists),
        user_attrs=user_attrs,
        system_attrs=system_attrs,
        intermediate_values={},
        trial_id=-1,
    )
    new_id = storage.create_new_trial(study_id_of(study), template_trial=template)
    if getattr(storage, "get_heartbeat_interval", lambda: None)():
        storage.record_heartbeat(new_id)  # type: ignore[attr-defined]
    return TrialRef(storage.get_trial(new_id).number, new_id)


def finish_trial(
    study: optuna.Study,
    trial: TrialRef,
    *,
    state: TrialState,
    value: float | None = None,
    user_attrs: Mapping[str, Any] | None = None,
) -> bool:
    """Store a RUNNING trial's attributes (added to, or replacing, those it has), its value (``state``
    COMPLETE) and its final state, all or nothing. False, writing nothing, when the trial is no longer
    RUNNING: another tuner failed it as stale, or an earlier attempt of this call committed."""
    if state == TrialState.COMPLETE and value is None:
        raise ValueError("a COMPLETE trial needs its value")
    user_attrs = dict(user_attrs or {})
    storage = study_storage(study)
    ours = flashtune_storage(storage)
    if ours is not None:
        return ours.finish_running_trial(trial.trial_id, state=state, value=value, user_attrs=user_attrs)
    if storage.get_trial(trial.trial_id).state != TrialState.RUNNING:
        return False
    for key, v in user_attrs.items():
        storage.set_trial_user_attr(trial.trial_id, key, v)
    study.tell(
        trial.number,
        value if state == TrialState.COMPLETE else None,
        state=None if state == TrialState.COMPLETE else state,
    )
    return True
