"""One loop for a host's GPUs on one study (tune --gpus), joining a study (flashtune worker), mixed GPUs refused."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.trial import TrialState

from tests.fakes.fake_gpu import FakeGpu
from tests.fakes.standin_tuner import PROBLEM
from tuner.errors import UsageError
from tuner.run import RunSpec, TuneSettings, gpu_infos, join_study, prepare_study, run_on_gpus
from tuner.study import DUPLICATE_OF, STATUS, WINNER, StorageError, open_storage

HANDLER = FakeGpu
COMPILER = "tests.fakes.standin_tuner:standin_compile"


def _spec(tmp_path, n_trials=24) -> RunSpec:
    return RunSpec(
        family="sm80",
        problem=PROBLEM,
        storage_url=f"sqlite:///{tmp_path}/s.db",
        sampler="tpe",
        seed=3,
        settings=TuneSettings(n_trials=n_trials, compile_workers=2, compile_ahead=2),
        handler=HANDLER,
        compiler=COMPILER,
    )


def _evaluated(spec):
    trials = optuna.load_study(study_name=spec.study_name, storage=spec.storage_url).get_trials(deepcopy=False)
    return trials, [
        t
        for t in trials
        if t.state.is_finished()
        and t.user_attrs.get(STATUS) not in (None, "infeasible")
        and DUPLICATE_OF not in t.user_attrs
    ]


def test_two_gpus_share_one_loop(tmp_path):
    infos = gpu_infos([0, 1], handler=HANDLER)
    spec = prepare_study(_spec(tmp_path), infos[0])
    summary = run_on_gpus(spec, [0, 1], infos)
    assert summary.stats.gpus == 2 and all(n > 0 for n in summary.stats.measured_per_gpu)  # both GPUs did work
    trials, evaluated = _evaluated(spec)
    assert len(evaluated) == 24 == summary.evaluated
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_a_worker_joins_with_the_study_s_own_family_problem_and_target(tmp_path):
    infos = gpu_infos([0], handler=HANDLER)
    spec = prepare_study(_spec(tmp_path, n_trials=10), infos[0])
    run_on_gpus(spec, [0], infos)
    joined = join_study(spec.storage_url, spec.study_name, n_trials=16)
    assert (joined.spec.family, joined.spec.problem, joined.spec.sampler, joined.spec.seed) == (
        "sm80",
        PROBLEM,
        "tpe",
        3,
    )
    joined = dataclasses.replace(joined, spec=dataclasses.replace(joined.spec, handler=HANDLER, compiler=COMPILER))
    run_on_gpus(joined, [0], infos)
    assert len(_evaluated(spec)[1]) == 16
    assert join_study(spec.storage_url, spec.study_name).settings.n_trials == 10  # the stored target


def test_joining_a_missing_study_says_how_to_create_it(tmp_path):
    open_storage(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(UsageError, match="create it with `flashtune tune`"):
        join_study(f"sqlite:///{tmp_path}/s.db", "nope")
    with pytest.raises(StorageError, match="run `flashtune tune` first"):  # no database there at all
        join_study(f"sqlite:///{tmp_path}/other.db", "nope")
    assert not (tmp_path / "other.db").exists()


def test_mixed_gpu_models_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTUNE_STANDIN_MIXED", "1")
    with pytest.raises(UsageError, match="different models"):
        gpu_infos([0, 1], handler=HANDLER)


def test_a_gpu_of_another_model_cannot_join_a_study(tmp_path, monkeypatch):
    infos = gpu_infos([0], handler=HANDLER)
    spec = prepare_study(_spec(tmp_path, n_trials=2), infos[0])
    other = dict(infos[0], name="Other GPU")
    with pytest.raises(UsageError, match="timings do not compare"):
        run_on_gpus(spec, [0], [other])


@pytest.mark.parametrize(
    ("family", "arch", "fragment"),
    [
        (
            "sm90",
            100,
            "sm90 is built for sm_90a only (arch-specific instructions); the device is sm_100 (Blackwell stand-in)"
            "; families that run there: sm80",
        ),
        ("sm90", 80, "sm90 is built for sm_90a only"),
    ],
)
def test_a_family_that_cannot_run_on_the_gpu_is_refused_before_a_study_exists(tmp_path, family, arch, fragment):
    from dataclasses import replace

    info = {**gpu_infos([0], handler=HANDLER)[0], "arch": arch, "name": "Blackwell stand-in"}
    spec = replace(_spec(tmp_path), family=family)
    with pytest.raises(UsageError) as e:
        prepare_study(spec, info)
    assert fragment in str(e.value)
    assert not optuna.get_all_study_summaries(open_storage(spec.storage_url))


def test_a_suite_on_two_gpus_tunes_each_study_on_one_of_them_with_one_worker_each(tmp_path, capfd):
    """tune_suite: studies shared out over the GPUs, each GPU's worker process started once for all its studies,
    every study tuned to its target and re-timed, rerunning skips what is finished."""
    from tuner.run import tune_suite
    from tuner.study import is_finished, load_suite, suite_studies

    path = tmp_path / "mini.toml"
    path.write_text(
        'family = "sm80"\n[grid]\ndtype = "fp16"\ncausal = [false, true]\nhead_dim = 128\nheads = 8\n'
        "seqlen = [512, 1024]\nbatch = 2\n"
    )
    suite = load_suite(path)
    infos = gpu_infos([0, 1], handler=HANDLER)
    base = _spec(tmp_path, n_trials=6)
    tune_suite(suite, base, [0, 1], infos, top_k=2, rounds=1)
    err = capfd.readouterr().err
    storage = open_storage(base.storage_url)
    names = [entry.studies for entry in suite_studies(storage, suite)]
    assert all(len(n) == 1 for n in names) and len(names) == 4
    for (name,) in names:
        assert is_finished(storage, name, 6)
        assert err.count(f"study {name}\n") == 1  # tuned by one GPU
    assert err.count("[gpu 0] ") and err.count("[gpu 1] ")
    assert err.count("worker restarts") == 4  # one summary line per study
    tune_suite(suite, base, [0, 1], infos, top_k=2, rounds=1)
    assert capfd.readouterr().err.count("is finished, skipped") == 4


def test_one_run_loads_its_space_opens_its_storage_and_loads_its_study_once(tmp_path, monkeypatch):
    """What `flashtune tune` does in its own process (create, tune, re-time) resolves what the spec names once,
    and passes the objects down (compile processes load the space once each, in their own process)."""
    import collections

    import tuner.run._run as run_module
    from tuner.run import retime_winner

    calls: collections.Counter[str] = collections.Counter()

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(run_module, "load_space", counted("space", run_module.load_space))
    monkeypatch.setattr(run_module, "open_storage", counted("storage", run_module.open_storage))
    monkeypatch.setattr(optuna, "load_study", counted("study", optuna.load_study))
    infos = gpu_infos([0], handler=HANDLER)
    run = prepare_study(_spec(tmp_path, n_trials=4), infos[0])
    assert (calls["space"], calls["storage"]) == (1, 1)
    calls["study"] = 0  # creating or resuming the study is the study's business; from here on it is not loaded
    run_on_gpus(run, [0], infos)
    retime_winner(run, 0, top_k=2, rounds=1)
    assert dict(calls) == {"space": 1, "storage": 1, "study": 0}
    assert run.study.user_attrs.get(WINNER) is not None  # the run went through: tuned and re-timed
