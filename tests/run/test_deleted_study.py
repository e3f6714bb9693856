"""A study deleted from the storage while a tuner runs on it: one StorageError saying so, not Optuna's
KeyError('Record does not exist.'), wherever in the loop the tuner notices."""

from __future__ import annotations

import optuna
import pytest

from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure
from tests.run.test_tune import make_study, settings, tune_study
from tuner.study import StorageError, open_storage


@pytest.mark.parametrize("delete_at", [1, 2, 4])
@pytest.mark.parametrize("compile_ahead", [1, 3])
def test_a_study_deleted_under_the_tuner_is_one_storage_error(
    sqlite_url, toy_space, problem, sm80, delete_at, compile_ahead
):
    storage = open_storage(sqlite_url)
    study = make_study(storage, toy_space, problem)

    class Deleting(FakeMeasure):
        def __call__(self, job):
            if len(self.calls) + 1 == delete_at:
                optuna.delete_study(study_name=study.study_name, storage=storage)
            return super().__call__(job)

    with pytest.raises(StorageError, match="deleted") as info:
        tune_study(
            study,
            toy_space,
            problem,
            sm80,
            Deleting(),
            settings(8, compile_ahead=compile_ahead),
            compiler=fake_compiler,
        )
    assert "\n" not in str(info.value) and "Record does not exist" not in str(info.value)
