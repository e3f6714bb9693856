"""A trial's outcome as the tuning loop stores it: status, reason, measurement attributes and value,
in one write; the same outcome for an enqueued duplicate; how a stopping tuner leaves its trials."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..space import Config, config_key
from ._attributes import (
    CONFIG_KEY,
    DUPLICATE_OF,
    EXPLORATION,
    IS_DEFAULT,
    REASON,
    REQUEUE_COUNT,
    REQUEUE_REASON,
    REQUEUED_FROM,
    STATUS,
)
from ._meta import TrialStatus
from ._optuna_storage import enqueued_config, study_storage
from ._trial_writes import TrialRef, finish_trial

__all__ = ["finish", "finish_duplicate", "finished", "outcome_attrs", "stop_cleanly"]


def outcome_attrs(config: Config | None, status: str, reason: str, attrs: dict[str, Any] | None) -> dict[str, Any]:
    """The user attributes of an outcome (``config`` None: a trial stopped before its config was drawn)."""
    out = {STATUS: status, **(attrs or {})}
    if config is not None:
        out[CONFIG_KEY] = config_key(config)
    if reason:
        out[REASON] = reason[:1000]
    return out


def _final_state(value: float | None, state: TrialState | None) -> TrialState:
    return TrialState.COMPLETE if value is not None else state or TrialState.PRUNED


def finished(
    trial: TrialRef,
    config: Config | None,
    dists: dict[str, Any],
    *,
    status: str,
    reason: str = "",
    attrs: dict[str, Any] | None = None,
    value: float | None = None,
    state: TrialState | None = None,
) -> FrozenTrial:
    """The trial as it will be stored: what the loop counts while the storing thread writes it."""
    return FrozenTrial(
        number=trial.number,
        state=_final_state(value, state),
        value=value,
        values=None,
        datetime_start=None,
        datetime_complete=datetime.now(),
        params=dict(config or {}),
        distributions=dists if config else {},
        user_attrs=outcome_attrs(config, status, reason, attrs),
        system_attrs={},
        intermediate_values={},
        trial_id=trial.trial_id,
    )


def finish(
    study: optuna.Study,
    trial: TrialRef,
    storage_call: Callable[..., Any],
    *,
    config: Config | None,
    dists: dict[str, Any],
    status: str,
    reason: str = "",
    attrs: dict[str, Any] | None = None,
    value: float | None = None,
    state: TrialState | None = None,
) -> FrozenTrial:
    """Store the trial's outcome in one retried write: ``value`` given, COMPLETE; otherwise ``state``
    (default PRUNED, which searches treat as bad). Returns the trial as stored: the outcome written
    here, or, when the trial was no longer RUNNING, what is stored (an earlier attempt committed and
    lost its reply, or another tuner failed the trial as stale while this one could not beat)."""
    outcome = finished(trial, config, dists, status=status, reason=reason, attrs=attrs, value=value, state=state)

    def store() -> FrozenTrial:
        if finish_trial(study, trial, state=outcome.state, value=value, user_attrs=outcome.user_attrs):
            return outcome
        return study_storage(study).get_trial(trial.trial_id)

    return storage_call(store, what=f"storing trial {trial.number}")


def finish_duplicate(
    study: optuna.Study, trial: TrialRef, original: FrozenTrial, storage_call: Callable[..., Any], dists: dict[str, Any]
) -> FrozenTrial:
    """An enqueued config was evaluated already: give it the same outcome without measuring again."""
    attrs = {DUPLICATE_OF: original.number}
    status = original.user_attrs.get(STATUS, TrialStatus.OK)
    config = dict(original.params)
    if original.state == TrialState.COMPLETE:
        return finish(
            study, trial, storage_call, config=config, dists=dists, status=status, attrs=attrs, value=original.value
        )
    return finish(
        study,
        trial,
        storage_call,
        config=config,
        dists=dists,
        status=status,
        reason=original.user_attrs.get(REASON, ""),
        attrs=attrs,
    )


def stop_cleanly(
    study: optuna.Study,
    held: list[tuple[TrialRef, Config | None, bool]],
    storage_call: Callable[..., Any],
    dists: dict[str, Any],
) -> None:
    """Fail every trial this tuner holds as interrupted, and enqueue again, right after its trial is
    failed, each config that was drawn but not measured (``(trial, config, requeue)``; config None
    with requeue: the trial's enqueued config, if it had one). Nothing is left RUNNING and nothing
    drawn is lost; a trial another tuner already failed (as stale) is left to that tuner's recovery,
    which enqueued it again itself."""
    for trial, config, requeue in held:
        try:
            if requeue and config is None:
                config = enqueued_config(study_storage(study).get_trial(trial.trial_id))
            frozen = finish(
                study,
                trial,
                storage_call,
                config=None,
                dists=dists,
                status=TrialStatus.INTERRUPTED,
                reason="the tuner stopped",
                state=TrialState.FAIL,
            )
            if requeue and config is not None and TrialStatus.of(frozen) is TrialStatus.INTERRUPTED:
                storage_call(
                    lambda: _requeue_interrupted(study, trial, config),  # noqa: B023 - called at once
                    what=f"enqueuing trial {trial.number}'s config again",
                )
        except Exception:
            pass


def _requeue_interrupted(study: optuna.Study, trial: TrialRef, config: Config) -> None:
    """Enqueue the config of a trial the tuner stopped before measuring, keeping its role (the
    default config stays the default, so the study still shows its speedup over it) and its count
    of re-enqueues after lost workers (so a config that keeps killing them still runs out)."""
    stored = study_storage(study).get_trial(trial.trial_id).user_attrs
    kept = {k: v for k, v in stored.items() if k in (IS_DEFAULT, EXPLORATION, REQUEUE_COUNT)}
    study.enqueue_trial(
        dict(config),
        user_attrs={
            REQUEUED_FROM: trial.number,
            REQUEUE_REASON: f"trial {trial.number} was interrupted",
            **kept,
        },
        skip_if_exists=False,
    )
