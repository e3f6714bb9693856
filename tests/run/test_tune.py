"""tuner.tune: the ask → check → compile → measure → tell loop, with a fake compiler and a fake GPU."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import tuner.study as st
from tests.fakes.fake_compile import exploding_compiler, fake_compiler, refuses
from tests.fakes.fake_measure import FakeMeasure, model_tflops, wrong
from tuner.run import TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.study import open_storage

GPU = {
    "name": "Fake GPU",
    "arch": 80,
    "num_sms": 108,
    "smem_per_block_optin": 166912,
    "regs_per_sm": 65536,
    "driver": "0.0",
}

INFEASIBLE = {"block_m": 64, "block_n": 128, "stages": 3, "flag": 0}  # 212992 B of smem at d128 > sm_80's 166912
COMPILE_ERROR = {"block_m": 64, "block_n": 32, "stages": 1, "flag": 0}
WRONG = {"block_m": 32, "block_n": 64, "stages": 2, "flag": 1}


@pytest.fixture
def storage(sqlite_url):
    return open_storage(sqlite_url)


def make_study(storage, space, problem, *, name="toy-study", seed=0, sampler="random"):
    return st.open_study(
        storage=storage, name=name, space=space, problem=problem, gpu=GPU, sampler=make_sampler(sampler, space, seed)
    )


def settings(n_trials, **kw):
    return TuneSettings(n_trials=n_trials, compile_workers=1, **kw)


def tune_study(study, space, problem, device, measure, run_settings, *, sampler="random", seed=0, **kw):
    """tune() with the search ``sampler`` names, seeded as make_study seeds the study (unless ``search`` given)."""
    search = kw.pop("search", None) or make_search(sampler, space, problem, device, seed)
    return tune(study, space, problem, device, measure, run_settings, search=search, **kw)


def evaluated_trials(study):
    return [
        t
        for t in study.get_trials()
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and t.user_attrs.get(st.STATUS) != "infeasible"
        and st.DUPLICATE_OF not in t.user_attrs
    ]


def snapshot(study):
    return [(t.number, t.state, t.params, t.value, t.user_attrs) for t in study.get_trials()]


def test_statuses_of_every_kind(storage, toy_space, problem, sm80):
    study = make_study(storage, toy_space, problem)
    for config in (INFEASIBLE, COMPILE_ERROR, WRONG, toy_space.defaults()):
        study.enqueue_trial(config)
    measure = FakeMeasure()
    summary = tune_study(study, toy_space, problem, sm80, measure, settings(8, compile_ahead=1), compiler=fake_compiler)
    trials = study.get_trials()

    default = trials[0]
    assert default.params == toy_space.defaults()
    assert default.user_attrs[st.IS_DEFAULT] is True
    assert default.state == TrialState.COMPLETE and default.user_attrs[st.STATUS] == "ok"
    assert default.value == pytest.approx(model_tflops(toy_space.defaults()))
    assert default.user_attrs[st.RESOURCES]["registers"] == 96 + 16
    assert default.user_attrs[st.COMPILE] == {"seconds": 0.01, "cached": False, "arch": "80"}
    assert default.user_attrs[st.MEASUREMENT]["tflops"] == default.value
    assert default.user_attrs[st.CONFIG_KEY]
    assert not any(t.user_attrs.get(st.IS_DEFAULT) for t in trials[1:])

    infeasible = trials[1]
    assert infeasible.params == INFEASIBLE and infeasible.state == TrialState.PRUNED
    assert infeasible.user_attrs[st.STATUS] == "infeasible"
    assert "smem_fits" in infeasible.user_attrs[st.REASON] and "212992" in infeasible.user_attrs[st.REASON]

    compile_error = trials[2]
    assert compile_error.params == COMPILE_ERROR and compile_error.state == TrialState.PRUNED
    assert compile_error.user_attrs[st.STATUS] == "compile_error"
    assert "static assertion" in compile_error.user_attrs[st.REASON]

    wrong_result = trials[3]
    assert wrong_result.params == WRONG and wrong_result.state == TrialState.PRUNED
    assert wrong_result.user_attrs[st.STATUS] == "wrong_result"
    assert "relative error" in wrong_result.user_attrs[st.REASON]
    assert wrong_result.user_attrs[st.MEASUREMENT]["rel_error"] == 0.5

    duplicate = trials[4]
    assert duplicate.params == toy_space.defaults()
    assert duplicate.user_attrs[st.DUPLICATE_OF] == 0
    assert duplicate.state == TrialState.COMPLETE and duplicate.value == default.value

    # the whole study: every trial finished, statuses consistent with the fakes and the space
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    for t in trials:
        status = t.user_attrs[st.STATUS]
        if st.DUPLICATE_OF in t.user_attrs:
            original = trials[t.user_attrs[st.DUPLICATE_OF]]
            assert original.params == t.params and original.user_attrs[st.STATUS] == status
            continue
        if toy_space.check(t.params, problem, sm80):
            assert status == "infeasible"
        elif refuses(t.params):
            assert status == "compile_error"
        elif wrong(t.params):
            assert status == "wrong_result"
        else:
            assert status == "ok" and t.value == pytest.approx(model_tflops(t.params))
        if t.state == TrialState.PRUNED:
            assert t.user_attrs[st.REASON]

    # infeasible configs and duplicates do not count towards n_trials
    assert len(evaluated_trials(study)) == 8 == summary.evaluated == sum(st.is_evaluated(t) for t in trials)
    assert (
        summary.infeasible
        == sum(t.user_attrs[st.STATUS] == "infeasible" and st.DUPLICATE_OF not in t.user_attrs for t in trials)
        >= 1
    )
    assert summary.duplicates == sum(st.DUPLICATE_OF in t.user_attrs for t in trials) >= 1
    assert summary.failed >= 2
    assert "8 evaluated" in summary.stopped_because, summary.stopped_because
    assert summary.best_tflops == max(t.value for t in trials if t.state == TrialState.COMPLETE)

    # the GPU saw each compiled config once, with the launch geometry of the space
    measured = [t for t in evaluated_trials(study) if t.user_attrs[st.STATUS] != "compile_error"]
    assert len(measure.calls) == len(measured)
    job = measure.calls[0]
    geometry = toy_space.launch(toy_space.defaults(), problem, sm80)
    assert (job.grid, job.threads, job.smem_bytes) == (geometry.grid, geometry.threads, geometry.smem_bytes)
    assert job.tag == "trial-0" and job.abi == "flat" and job.problem == problem and job.settings.check


def test_duplicate_proposed_while_the_original_compiles(storage, toy_space, problem, sm80):
    """With compile-ahead, the same config may be asked for twice before the first finishes: measure it once."""
    study = make_study(storage, toy_space, problem)
    study.enqueue_trial(toy_space.defaults())
    measure = FakeMeasure()
    tune_study(study, toy_space, problem, sm80, measure, settings(3, compile_ahead=4), compiler=fake_compiler)
    trials = study.get_trials()
    assert trials[1].params == toy_space.defaults()
    assert trials[1].user_attrs.get(st.DUPLICATE_OF) == 0
    assert trials[1].value == trials[0].value
    assert sum(job.config == toy_space.defaults() for job in measure.calls) == 1
    assert len(evaluated_trials(study)) == 3
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_resume_keeps_earlier_trials_and_completes_the_budget(storage, toy_space, problem, sm80):
    study = make_study(storage, toy_space, problem)
    first = tune_study(
        study, toy_space, problem, sm80, FakeMeasure(), settings(4, compile_ahead=2), compiler=fake_compiler
    )
    assert first.evaluated == 4 == len(evaluated_trials(study))
    before = snapshot(study)

    resumed = make_study(storage, toy_space, problem)  # as a second `flashtune tune` would
    assert len(resumed.get_trials()) == len(before)
    second = tune_study(
        resumed, toy_space, problem, sm80, FakeMeasure(), settings(9, compile_ahead=2), compiler=fake_compiler
    )
    assert len(evaluated_trials(resumed)) == 9
    assert second.evaluated == 5  # this run's share
    assert snapshot(resumed)[: len(before)] == before
    assert sum(bool(t.user_attrs.get(st.IS_DEFAULT)) for t in resumed.get_trials()) == 1  # default enqueued once

    # a third run with the same budget has nothing to do
    count = len(resumed.get_trials())
    measure = FakeMeasure()
    third = tune_study(
        make_study(storage, toy_space, problem), toy_space, problem, sm80, measure, settings(9), compiler=fake_compiler
    )
    assert third.evaluated == 0 and not measure.calls
    assert len(resumed.get_trials()) == count
    assert "9 evaluated" in third.stopped_because


@pytest.mark.parametrize("interrupt_at", [1, 3])
def test_interrupt_leaves_no_trial_running(storage, toy_space, problem, sm80, interrupt_at):
    study = make_study(storage, toy_space, problem)
    with pytest.raises(KeyboardInterrupt):
        tune_study(
            study,
            toy_space,
            problem,
            sm80,
            FakeMeasure(interrupt_at=interrupt_at),
            settings(8, compile_ahead=3),
            compiler=fake_compiler,
        )
    trials = study.get_trials()
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert [t.user_attrs.get(st.STATUS) for t in trials if t.state == TrialState.FAIL]  # told, not left open
    assert all(t.user_attrs.get(st.STATUS) == "interrupted" for t in trials if t.state == TrialState.FAIL)
    done_before = [s for s in snapshot(study) if s[1].is_finished()]

    interrupted = {t.number: t.params for t in study.get_trials() if t.state == TrialState.FAIL}
    requeued = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert {t.user_attrs["requeued_from"] for t in requeued} == set(interrupted)
    assert sum(bool(t.user_attrs.get(st.IS_DEFAULT)) for t in requeued) == (interrupt_at == 1)  # the default first

    # resuming finishes the budget; interrupted configs are tried again, finished ones are kept
    tune_study(
        make_study(storage, toy_space, problem),
        toy_space,
        problem,
        sm80,
        FakeMeasure(),
        settings(8),
        compiler=fake_compiler,
    )
    assert len(evaluated_trials(study)) == 8
    after = {s[0]: s for s in snapshot(study)}
    assert [after[s[0]] for s in done_before] == done_before
    assert not [t for t in study.get_trials() if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    measured = {tuple(sorted(t.params.items())) for t in evaluated_trials(study)}
    assert {tuple(sorted(p.items())) for p in interrupted.values()} <= measured
    assert st.default_trial(study) is not None  # the speedup over the default survives an early Ctrl-C


def test_time_budget(storage, toy_space, problem, sm80):
    import time

    study = make_study(storage, toy_space, problem)
    start = time.monotonic()
    summary = tune_study(
        study,
        toy_space,
        problem,
        sm80,
        FakeMeasure(delay_s=0.3),
        TuneSettings(n_trials=None, timeout_s=1.5, compile_workers=1, compile_ahead=1),
        compiler=fake_compiler,
    )
    assert summary.stopped_because == "time budget used"
    assert time.monotonic() - start < 10
    assert 1 <= summary.evaluated < 20


def test_exhausted_space_stops(tmp_path, storage, problem, sm80):
    from tests.conftest import toy_space_text
    from tuner.space import load_space

    path = tmp_path / "small" / "toy.toml"
    path.parent.mkdir()
    path.write_text(toy_space_text(block_m=(64,), block_n=(64, 128), stages=(2,), flag=(0, 1)))
    space = load_space(path)
    study = make_study(storage, space, problem)
    summary = tune_study(
        study, space, problem, sm80, FakeMeasure(), settings(50, compile_ahead=1), compiler=fake_compiler
    )
    assert "exhausted" in summary.stopped_because
    assert summary.evaluated == 4 == len(evaluated_trials(study))
    assert {tuple(t.params.values()) for t in evaluated_trials(study)} == {
        (64, 64, 2, 0),
        (64, 64, 2, 1),
        (64, 128, 2, 0),
        (64, 128, 2, 1),
    }


def test_dead_compile_process_is_a_compile_error(storage, toy_space, problem, sm80):
    study = make_study(storage, toy_space, problem)
    summary = tune_study(
        study, toy_space, problem, sm80, FakeMeasure(), settings(1, compile_ahead=1), compiler=exploding_compiler
    )
    trial = study.get_trials()[0]
    assert trial.state == TrialState.PRUNED and trial.user_attrs[st.STATUS] == "compile_error"
    assert "compile process died" in trial.user_attrs[st.REASON]
    assert summary.failed == 1


def test_progress_events(storage, toy_space, problem, sm80):
    events = []
    tune_study(
        make_study(storage, toy_space, problem),
        toy_space,
        problem,
        sm80,
        FakeMeasure(),
        settings(3),
        compiler=fake_compiler,
        progress=events.append,
    )
    assert events[-1]["event"] == "done" and events[-1]["evaluated"] == 3 and events[-1]["target"] == 3
    assert sum(e["event"] == "trial" for e in events) == 3
    assert events[-1]["best_tflops"] is not None
    assert events[-1]["configs_per_s"] > 0 and events[-1]["gpu_busy"] >= 0 and events[-1]["compile_wait_s"] >= 0


def test_the_progress_line_shows_throughput():
    import io

    from tuner.run import Progress

    out = io.StringIO()
    Progress(out)(
        {
            "event": "done",
            "evaluated": 7,
            "target": 10,
            "best_tflops": 512.25,
            "compiling": 3,
            "infeasible": 2,
            "failed": 1,
            "configs_per_s": 4.5,
            "gpu_busy": 0.62,
        }
    )
    line = out.getvalue()
    assert "7/10 trials" in line and "512.2 TFLOPS" in line and "4.50 configs/s" in line and "GPU busy 62%" in line


def test_a_run_stores_and_returns_its_throughput(storage, toy_space, problem, sm80):
    study = make_study(storage, toy_space, problem)
    summary = tune_study(study, toy_space, problem, sm80, FakeMeasure(), settings(4), compiler=fake_compiler)
    stats = summary.stats
    assert stats.evaluated == 4 and stats.measured == 4 and stats.wall_s > 0
    assert stats.measure_s >= 0 and stats.compile_wait_s >= 0 and stats.storage_s > 0
    stored = [v for k, v in study.user_attrs.items() if k.startswith(st.THROUGHPUT_PREFIX)]
    assert len(stored) == 1 and stored[0]["evaluated"] == 4 and stored[0]["configs_per_s"] > 0
    assert "4 configs in" in stats.line() and "GPU busy" in stats.line()


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_each_sampler_runs_a_study(storage, toy_space, problem, sm80, sampler):
    study = make_study(storage, toy_space, problem, sampler=sampler, name=f"s-{sampler}")
    summary = tune_study(
        study, toy_space, problem, sm80, FakeMeasure(), settings(5), compiler=fake_compiler, sampler=sampler
    )
    assert summary.evaluated == 5
    assert study.get_trials()[0].params == toy_space.defaults()


def test_the_grid_sampler_covers_a_small_space_and_stops_as_exhausted(storage, tmp_path, problem, sm80):
    from tests.conftest import toy_space_text
    from tuner.space import load_space

    (tmp_path / "toy.toml").write_text(toy_space_text(block_m=(32, 64), block_n=(32, 64), stages=(1, 2)))
    space = load_space(tmp_path / "toy.toml")  # 16 points, all statically feasible
    study = make_study(storage, space, problem, sampler="grid", name="grid")
    summary = tune_study(
        study, space, problem, sm80, FakeMeasure(), settings(50), compiler=fake_compiler, sampler="grid"
    )
    assert "space exhausted" in summary.stopped_because
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.FAIL, TrialState.RUNNING)]
    measured = [t for t in trials if st.DUPLICATE_OF not in t.user_attrs]
    assert len({tuple(sorted(t.params.items())) for t in measured}) == len(measured) == 16


def _first_value(distribution):
    """What a sampler draws for a knob's first value (an ordered knob is searched as its value index)."""
    return (
        distribution.low if isinstance(distribution, optuna.distributions.IntDistribution) else distribution.choices[0]
    )


class _StuckSampler(optuna.samplers.BaseSampler):
    """Always proposes each knob's first value: a sampler that has converged for good."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return _first_value(param_distribution)


def test_a_sampler_that_repeats_itself_gets_unseen_configs_explored(storage, toy_space, problem, sm80):
    from tuner.search import OptunaSearch

    study = st.open_study(
        storage=storage, name="stuck", space=toy_space, problem=problem, gpu=GPU, sampler=_StuckSampler()
    )
    summary = tune_study(
        study,
        toy_space,
        problem,
        sm80,
        FakeMeasure(),
        settings(6, compile_ahead=1),
        compiler=fake_compiler,
        search=OptunaSearch(toy_space, problem, sm80, 0, _StuckSampler()),
    )
    evaluated = evaluated_trials(study)
    assert len(evaluated) == 6 and summary.stopped_because == "the study holds 6 evaluated trials"
    assert len({tuple(sorted(t.params.items())) for t in evaluated}) == 6  # six different configs
    assert sum(1 for t in evaluated if t.user_attrs.get(st.EXPLORATION)) >= 4  # all but the default and the stuck one
    assert summary.explorations >= 4
    assert not [t for t in study.get_trials() if st.DUPLICATE_OF in t.user_attrs]  # repeats never reach storage


class _InfeasibleSampler(_StuckSampler):
    """Proposes random configs of which none passes the static check: lost in the infeasible part of a space."""

    def __init__(self, space, problem, device):
        self.rng = __import__("random").Random(0)
        self.space, self.problem, self.device = space, problem, device
        self.drawn = []

    def sample_independent(self, study, trial, param_name, param_distribution):
        if param_name == self.space.knobs[0].name:
            while True:
                config = {k.name: self.rng.choice(k.values) for k in self.space.knobs}
                if self.space.check(config, self.problem, self.device) is not None:
                    self.drawn.append(config)
                    break
        value = self.drawn[-1][param_name]
        is_index = isinstance(param_distribution, optuna.distributions.IntDistribution)
        return self.space.knob(param_name).values.index(value) if is_index else value


def test_a_sampler_lost_in_infeasible_configs_gets_them_repaired_without_storing_them(
    storage, toy_space, problem, sm80
):
    from tuner.search._optuna import OptunaSearch

    sampler = _InfeasibleSampler(toy_space, problem, sm80)
    study = st.open_study(storage=storage, name="lost", space=toy_space, problem=problem, gpu=GPU, sampler=sampler)
    search = OptunaSearch(toy_space, problem, sm80, 0, sampler)
    summary = tune_study(
        study,
        toy_space,
        problem,
        sm80,
        FakeMeasure(),
        settings(5, compile_ahead=1),
        search=search,
        compiler=fake_compiler,
    )
    evaluated = evaluated_trials(study)
    assert len(evaluated) == 5 and summary.stopped_because == "the study holds 5 evaluated trials"
    assert not [t for t in study.get_trials() if t.user_attrs.get(st.STATUS) == "infeasible"]  # none stored
    assert search.stats.infeasible == len(sampler.drawn) >= 4  # every draw but the default's was infeasible ...
    for t in evaluated[1:]:  # ... and repaired to a feasible config a few knob steps away
        assert toy_space.check(t.params, problem, sm80) is None
        assert min(sum(t.params[k] != d[k] for k in d) for d in sampler.drawn) <= 3


def test_storing_again_after_a_lost_reply_keeps_the_committed_outcome(storage):
    # the database commits the tell, then the connection drops before the reply: the retry
    # finds the trial finished (CI, session 1) and must return it, not fail the tuner
    from tuner.study import TrialRef
    from tuner.study import finish as _finish

    study = optuna.create_study(storage=storage, direction="maximize")
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    calls = []

    def commit_then_lose_the_reply(store, what):
        calls.append(what)
        store()
        return store()

    frozen = _finish(
        study,
        TrialRef.of(trial),
        commit_then_lose_the_reply,
        config=trial.params,
        dists=trial.distributions,
        status="ok",
        attrs={"note": 1},
        value=12.5,
    )
    assert (frozen.state, frozen.value, frozen.user_attrs["note"]) == (TrialState.COMPLETE, 12.5, 1)
    assert calls == [f"storing trial {trial.number}"]


def test_a_gpu_worker_that_cannot_restart_stops_the_run_without_blaming_the_trial(storage, toy_space, problem, sm80):
    from tuner.run import WorkerUnavailable

    class DiesAtSecond(FakeMeasure):
        def __call__(self, job):
            if len(self.calls) == 1:
                self.calls.append(job)
                raise WorkerUnavailable("worker for GPU 0 could not start: no CUDA-capable device")
            return super().__call__(job)

    study = make_study(storage, toy_space, problem)
    with pytest.raises(WorkerUnavailable):
        tune_study(
            study, toy_space, problem, sm80, DiesAtSecond(), settings(6, compile_ahead=1), compiler=fake_compiler
        )
    trials = study.get_trials()
    assert not [t for t in trials if t.user_attrs.get(st.STATUS) in ("launch_error", "crashed", "timeout")]
    [stopped] = [t for t in trials if t.state == TrialState.FAIL]
    assert stopped.user_attrs[st.STATUS] == "interrupted"
    assert [t.user_attrs["requeued_from"] for t in trials if t.state == TrialState.WAITING] == [stopped.number]


def test_ctrl_c_while_the_default_is_drawn_fails_it_and_enqueues_it_again(
    storage, toy_space, problem, sm80, monkeypatch
):
    import tuner.run._loop as tune_mod

    def interrupted_draw(trial, dists):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_mod, "_draw", interrupted_draw)
    study = make_study(storage, toy_space, problem)
    with pytest.raises(KeyboardInterrupt):
        tune_study(study, toy_space, problem, sm80, FakeMeasure(), settings(4), compiler=fake_compiler)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    [failed] = [t for t in trials if t.state == TrialState.FAIL]
    [again] = [t for t in trials if t.state == TrialState.WAITING]
    assert failed.user_attrs[st.STATUS] == "interrupted" and failed.user_attrs.get(st.IS_DEFAULT)
    assert again.user_attrs.get(st.IS_DEFAULT) and again.user_attrs["requeued_from"] == failed.number
    assert again.system_attrs["fixed_params"] == toy_space.defaults()


def test_stopping_does_not_enqueue_again_a_trial_another_tuner_already_failed(storage, toy_space, problem):
    import functools

    from tuner.study import REQUEUE_COUNT, TrialRef, knob_distributions, retrying, stop_cleanly

    study = make_study(storage, toy_space, problem)
    dists = knob_distributions(toy_space, study.user_attrs)
    call = functools.partial(retrying, attempts=1)
    taken = study.ask()  # the enqueued default
    study.tell(taken, state=TrialState.FAIL)  # failed as stale by another tuner (which enqueued it again itself)
    stop_cleanly(study, [(TrialRef.of(taken), None, True)], call, dists)
    assert not [t for t in study.get_trials() if t.state == TrialState.WAITING]

    mine = study.ask(dists)
    study._storage.set_trial_user_attr(mine._trial_id, REQUEUE_COUNT, 1)
    stop_cleanly(study, [(TrialRef.of(mine), dict(mine.params), True)], call, dists)
    [again] = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert again.user_attrs[REQUEUE_COUNT] == 1  # kept: a config that keeps killing workers still runs out


# -- several GPUs, measuring beside the loop --------------------------------------------------------------------
def test_each_gpu_measures_on_a_lane_of_its_own_at_the_same_time(storage, toy_space, problem, sm80):
    import threading
    import time

    active, most, lock = [0], [0], threading.Lock()

    class Slow(FakeMeasure):
        def __call__(self, job):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.15)
            with lock:
                active[0] -= 1
            return super().__call__(job)

    gpus = [Slow(), Slow()]
    study = make_study(storage, toy_space, problem)
    summary = tune_study(study, toy_space, problem, sm80, gpus, settings(10), compiler=fake_compiler)
    assert summary.evaluated == 10 == len(evaluated_trials(study))
    assert summary.stats.gpus == 2 and summary.stats.measured_per_gpu == [len(g.calls) for g in gpus]
    assert all(g.calls for g in gpus) and most[0] == 2  # both GPUs busy at once
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]


def test_an_interruption_while_gpus_measure_re_enqueues_what_they_held(storage, toy_space, problem, sm80):
    study = make_study(storage, toy_space, problem)
    with pytest.raises(KeyboardInterrupt):
        gpus = [FakeMeasure(delay_s=0.1), FakeMeasure(delay_s=0.1, interrupt_at=2)]
        tune_study(study, toy_space, problem, sm80, gpus, settings(12), compiler=fake_compiler)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    interrupted = {t.number for t in trials if t.state == TrialState.FAIL}
    assert interrupted and all(t.user_attrs[st.STATUS] == "interrupted" for t in trials if t.number in interrupted)
    assert {t.user_attrs["requeued_from"] for t in trials if t.state == TrialState.WAITING} == interrupted


def test_each_gpu_is_prepared_once_before_its_first_measurement(storage, toy_space, problem, sm80):
    events = []

    class Prepared(FakeMeasure):
        def prepare(self, prob, measure_settings):
            events.append(("prepare", id(self), prob, measure_settings))

        def __call__(self, job):
            events.append(("measure", id(self)))
            return super().__call__(job)

    gpus = [Prepared(), Prepared()]
    tune_study(
        make_study(storage, toy_space, problem), toy_space, problem, sm80, gpus, settings(6), compiler=fake_compiler
    )
    for g in gpus:
        mine = [e for e in events if e[1] == id(g)]
        assert mine[0] == ("prepare", id(g), problem, settings(6).measure)
        assert [e[0] for e in mine[1:]] == ["measure"] * len(g.calls)


def test_compile_processes_run_at_a_lower_cpu_priority_than_the_tuner():
    import os

    from tuner.run import COMPILE_NICENESS, compile_pool

    pool = compile_pool(1)
    try:
        theirs = pool.submit(os.nice, 0).result(timeout=60)
    finally:
        pool.shutdown()
    assert theirs == min(19, os.nice(0) + COMPILE_NICENESS)


def test_compile_processes_exit_when_their_tuner_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, sys; from tuner.run import compile_pool\n"
        "pool = compile_pool(2)\n"
        "print(*{pool.submit(os.getpid).result() for _ in range(8)}, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    tuner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    children = [int(pid) for pid in tuner.stdout.readline().split()]
    assert children
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to collect it is gone too
            return f.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 10
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if alive(p)]
