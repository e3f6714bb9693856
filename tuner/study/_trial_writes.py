"""The tuning loop's trial writes, one short transaction each: a new RUNNING trial with its knobs,
attributes, owner and first heartbeat; a measured trial with its attributes, state and value.

Through Optuna's calls, creating a trial with 13 knobs on SQLite took ~25 ms and ~40 statements (a
lookup and a compatibility query per parameter), recording its owner and first beat two more
transactions, and ``tell`` read the trial back several times: the loop spent more time there than
on the GPU, and two tuners on one host queued behind each other for SQLite's one write lock. Here
the same rows are written (Optuna's own table models, values as Optuna encodes them) in a handful
of statements. Storages that are not Optuna's RDB storage (the in-memory one of replay and tests)
go through Optuna's public calls instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import FrozenTrial, TrialState

__all__ = ["TrialRef", "create_running_trial", "finish_trial"]


@dataclass(frozen=True)
class TrialRef:
    """A stored trial as the loop holds it: its number in the study and its storage id."""

    number: int
    trial_id: int

    @classmethod
    def of(cls, trial: optuna.trial.Trial | FrozenTrial) -> TrialRef:
        return cls(trial.number, trial._trial_id)


def _rdb(study: optuna.Study) -> Any | None:
    """Optuna's RDB storage behind the study (its storage may be Optuna's caching wrapper), or None."""
    backend = getattr(study._storage, "_backend", study._storage)
    return backend if hasattr(backend, "engine") and hasattr(backend, "scoped_session") else None


def _utc_now() -> datetime:
    """Now as Optuna's RDB storage keeps datetimes: naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def create_running_trial(study: optuna.Study, params: Mapping[str, Any], dists: Mapping[str, BaseDistribution], *,
                         user_attrs: Mapping[str, Any] | None = None,
                         system_attrs: Mapping[str, Any] | None = None) -> TrialRef:
    """A new RUNNING trial holding ``params`` (each with its distribution), with its attributes and, where
    the storage keeps heartbeats, a first beat; numbered as Optuna numbers trials (the count of the
    study's earlier trials, under a lock on the study's row)."""
    user_attrs, system_attrs = dict(user_attrs or {}), dict(system_attrs or {})
    rdb = _rdb(study)
    if rdb is None:
        template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, values=None,
                               datetime_start=datetime.now(), datetime_complete=None, params=dict(params),
                               distributions=dict(dists), user_attrs=user_attrs, system_attrs=system_attrs,
                               intermediate_values={}, trial_id=-1)
        trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
        return TrialRef(study._storage.get_trial(trial_id).number, trial_id)

    import sqlalchemy as sa
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    with rdb.engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE (tuner.storage), the whole database is ours
        conn.execute(sa.select(models.StudyModel.__table__.c.study_id)
                     .where(models.StudyModel.__table__.c.study_id == study._study_id).with_for_update())
        number = conn.execute(sa.select(sa.func.count(trials.c.trial_id))
                              .where(trials.c.study_id == study._study_id)).scalar_one()
        trial_id = conn.execute(trials.insert().values(number=number, study_id=study._study_id,
                                                       state=TrialState.RUNNING, datetime_start=_utc_now())
                                ).inserted_primary_key[0]
        conn.execute(models.TrialParamModel.__table__.insert(), [
            {"trial_id": trial_id, "param_name": name, "param_value": dists[name].to_internal_repr(value),
             "distribution_json": distribution_to_json(dists[name])} for name, value in params.items()])
        for model, attrs in ((models.TrialUserAttributeModel, user_attrs),
                             (models.TrialSystemAttributeModel, system_attrs)):
            if attrs:
                conn.execute(model.__table__.insert(), [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                                        for k, v in attrs.items()])
        if rdb.get_heartbeat_interval():
            conn.execute(models.TrialHeartbeatModel.__table__.insert().values(trial_id=trial_id))
    return TrialRef(number, trial_id)


def finish_trial(study: optuna.Study, trial: TrialRef, *, state: TrialState, value: float | None = None,
                 user_attrs: Mapping[str, Any] | None = None) -> bool:
    """Store a RUNNING trial's attributes (added to, or replacing, those it has), its value (``state``
    COMPLETE) and its final state, all or nothing. False, writing nothing, when the trial is no longer
    RUNNING: another tuner failed it as stale, or an earlier attempt of this call committed."""
    if state == TrialState.COMPLETE and value is None:
        raise ValueError("a COMPLETE trial needs its value")
    user_attrs = dict(user_attrs or {})
    rdb = _rdb(study)
    if rdb is None:
        if study._storage.get_trial(trial.trial_id).state != TrialState.RUNNING:
            return False
        for key, v in user_attrs.items():
            study._storage.set_trial_user_attr(trial.trial_id, key, v)
        study.tell(trial.number, value if state == TrialState.COMPLETE else None,
                   state=None if state == TrialState.COMPLETE else state)
        return True

    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    with rdb.engine.begin() as conn:
        done = conn.execute(trials.update()
                            .where(trials.c.trial_id == trial.trial_id, trials.c.state == TrialState.RUNNING)
                            .values(state=state, datetime_complete=_utc_now()))
        if done.rowcount != 1:
            return False  # nothing was written: the transaction commits nothing
        if user_attrs:
            table = models.TrialUserAttributeModel.__table__
            conn.execute(table.delete().where(table.c.trial_id == trial.trial_id, table.c.key.in_(list(user_attrs))))
            conn.execute(table.insert(), [{"trial_id": trial.trial_id, "key": k, "value_json": json.dumps(v)}
                                          for k, v in user_attrs.items()])
        if state == TrialState.COMPLETE:
            stored, value_type = models.TrialValueModel.value_to_stored_repr(value)
            values = models.TrialValueModel.__table__
            conn.execute(values.delete().where(values.c.trial_id == trial.trial_id))
            conn.execute(values.insert().values(trial_id=trial.trial_id, objective=0, value=stored,
                                                value_type=value_type))
    return True

