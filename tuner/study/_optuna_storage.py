"""Flashtune's Optuna storage, and the one module that touches what Optuna keeps private.

:class:`FlashtuneStorage` is the RDB storage :func:`tuner.study.open_storage` opens. Through
Optuna's calls, creating a trial with 13 knobs on SQLite took ~25 ms and ~40 statements (a lookup
and a compatibility query per parameter), recording its owner and first beat two more
transactions, and ``tell`` read the trial back several times: the loop spent more time there than
on the GPU, and two tuners on one host queued behind each other for SQLite's one write lock. Its
methods write the same rows (Optuna's own table models, values as Optuna encodes them) in one
short transaction each, read the heartbeats of a study's RUNNING trials by the database's clock,
and name Optuna's tables (to tell an Optuna database from another program's).

The functions below reach what an Optuna study or trial keeps private (its storage, its id, an
enqueued trial's config, the next waiting trial), so that no other module has to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

__all__ = [
    "FlashtuneStorage",
    "enqueued_config",
    "flashtune_storage",
    "pop_waiting_trial_id",
    "study_id_of",
    "study_storage",
    "trial_id_of",
]


def _utc_now() -> datetime:
    """Now as Optuna's RDB storage keeps datetimes: naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def _attr_rows(trial_id: int, attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()]


class FlashtuneStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage with the tuning loop's own trial writes and heartbeat read (see the module)."""

    @staticmethod
    def table_columns() -> dict[str, frozenset[str]]:
        """Optuna's tables (as this Optuna version creates them) and the names of their columns."""
        return {
            name: frozenset(c.name for c in table.columns) for name, table in models.BaseModel.metadata.tables.items()
        }

    def create_running_trial(
        self,
        study_id: int,
        params: Mapping[str, Any],
        dists: Mapping[str, BaseDistribution],
        *,
        user_attrs: Mapping[str, Any],
        system_attrs: Mapping[str, Any],
    ) -> tuple[int, int]:
        """A new RUNNING trial holding ``params`` (each with its distribution) and its attributes, with a
        first beat where heartbeats are on, in one transaction; ``(number, trial_id)``. Numbered as
        Optuna numbers trials: the count of the study's earlier trials, under a lock on the study's row."""
        trials, studies = models.TrialModel.__table__, models.StudyModel.__table__
        with self.engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE (tuner.study.open_storage), the database is ours
            conn.execute(sa.select(studies.c.study_id).where(studies.c.study_id == study_id).with_for_update())
            number = conn.execute(
                sa.select(sa.func.count(trials.c.trial_id)).where(trials.c.study_id == study_id)
            ).scalar_one()
            new_id = conn.execute(
                trials.insert().values(
                    number=number, study_id=study_id, state=TrialState.RUNNING, datetime_start=_utc_now()
                )
            ).inserted_primary_key[0]
            conn.execute(
                models.TrialParamModel.__table__.insert(),
                [
                    {
                        "trial_id": new_id,
                        "param_name": name,
                        "param_value": dists[name].to_internal_repr(value),
                        "distribution_json": distribution_to_json(dists[name]),
                    }
                    for name, value in params.items()
                ],
            )
            for model, attrs in (
                (models.TrialUserAttributeModel, user_attrs),
                (models.TrialSystemAttributeModel, system_attrs),
            ):
                if attrs:
                    conn.execute(model.__table__.insert(), _attr_rows(new_id, attrs))
            if self.get_heartbeat_interval():
                conn.execute(models.TrialHeartbeatModel.__table__.insert().values(trial_id=new_id))
        return number, new_id

    def finish_running_trial(
        self, trial_id: int, *, state: TrialState, value: float | None, user_attrs: Mapping[str, Any]
    ) -> bool:
        """Store a RUNNING trial's attributes (added to, or replacing, those it has), its value (``state``
        COMPLETE) and its final state in one transaction. False, writing nothing, when the trial is no
        longer RUNNING."""
        trials = models.TrialModel.__table__
        with self.engine.begin() as conn:
            done = conn.execute(
                trials.update()
                .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.RUNNING)
                .values(state=state, datetime_complete=_utc_now())
            )
            if done.rowcount != 1:
                return False  # nothing was written: the transaction commits nothing
            if user_attrs:
                table = models.TrialUserAttributeModel.__table__
                conn.execute(table.delete().where(table.c.trial_id == trial_id, table.c.key.in_(list(user_attrs))))
                conn.execute(table.insert(), _attr_rows(trial_id, user_attrs))
            if state == TrialState.COMPLETE:
                stored, value_type = models.TrialValueModel.value_to_stored_repr(value)
                values = models.TrialValueModel.__table__
                conn.execute(values.delete().where(values.c.trial_id == trial_id))
                conn.execute(
                    values.insert().values(trial_id=trial_id, objective=0, value=stored, value_type=value_type)
                )
        return True

    def running_trial_beats(self, study_id: int) -> tuple[dict[int, datetime], datetime]:
        """Every RUNNING trial's last beat (by trial id) and the database's clock now, read in one
        transaction, all as naive datetimes."""
        session = self.scoped_session()
        beats = models.TrialHeartbeatModel
        try:
            now = session.execute(sa.func.now()).scalar().replace(tzinfo=None)
            rows = (
                session.query(beats.trial_id, beats.heartbeat)
                .join(models.TrialModel, models.TrialModel.trial_id == beats.trial_id)
                .filter(models.TrialModel.study_id == study_id, models.TrialModel.state == TrialState.RUNNING)
                .all()
            )
            session.commit()
        except Exception:
            session.rollback()
            raise
        finally:
            session.close()
        return {trial: beat.replace(tzinfo=None) for trial, beat in rows}, now


# -- what Optuna keeps private on a study or trial ----------------------------------------------
def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage a study reads and writes through (for an RDB storage, Optuna's caching wrapper of it)."""
    return study._storage


def study_id_of(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def trial_id_of(trial: optuna.trial.Trial | FrozenTrial) -> int:
    """The trial's id in its storage (its number counts within the study; the id is the storage's key)."""
    return trial._trial_id


def flashtune_storage(storage: optuna.storages.BaseStorage) -> FlashtuneStorage | None:
    """The :class:`FlashtuneStorage` behind ``storage`` (itself, or the one Optuna's caching wrapper
    holds); None for any other storage (Optuna's in-memory one, a plain RDB storage)."""
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, FlashtuneStorage) else None


def enqueued_config(trial: FrozenTrial) -> dict[str, Any] | None:
    """The config a trial was enqueued with (Optuna fixes it on ask), or None for a sampled trial."""
    return trial.system_attrs.get("fixed_params")


def pop_waiting_trial_id(study: optuna.Study) -> int | None:
    """Take the study's oldest WAITING (enqueued) trial for this process, as ``study.ask`` does: its id,
    now RUNNING; None when none is waiting."""
    return study._pop_waiting_trial_id()
