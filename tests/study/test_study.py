"""tuner.study: creating, resuming (and refusing to resume) studies; names; results."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import fast_dir, toy_space_text
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure, model_tflops
from tuner._version import __version__
from tuner.problem import Problem
from tuner.run import TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.space import load_space
from tuner.study import CONFIG_KEY, knob_distributions, open_storage
from tuner.study import _meta as st

GPU = {
    "name": "Fake GPU",
    "arch": 80,
    "num_sms": 108,
    "smem_per_block_optin": 166912,
    "regs_per_sm": 65536,
    "driver": "0.0",
}


@pytest.fixture
def storage(sqlite_url):
    return open_storage(sqlite_url)


def _open(storage, space, problem, *, gpu=GPU, name="s"):
    return st.open_study(
        storage=storage, name=name, space=space, problem=problem, gpu=gpu, sampler=make_sampler("random", space, 0)
    )


def test_new_study_carries_its_metadata_and_the_default(storage, toy_space, problem):
    study = _open(storage, toy_space, problem)
    attrs = study.user_attrs
    assert attrs["flashtune"] == {"version": __version__, "schema": st.SCHEMA_VERSION}
    assert attrs["family"] == "toy"
    assert Problem.from_dict(attrs["problem"]) == problem == st.study_problem(study)
    assert attrs["gpu"] == GPU
    assert attrs["space_digest"] == st.space_digest(toy_space)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    [waiting] = study.get_trials()
    assert waiting.state == TrialState.WAITING
    assert waiting.system_attrs["fixed_params"] == toy_space.defaults()  # enqueued: params are fixed on ask
    assert waiting.user_attrs == {st.IS_DEFAULT: True}


def test_the_enqueued_default_is_the_one_for_the_problem_s_head_dim(storage, tmp_path, problem):
    text = toy_space_text().replace(
        'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_head_dim = { 128 = 32 }'
    )
    (tmp_path / "toy.toml").write_text(text)
    space = load_space(tmp_path / "toy.toml")
    assert problem.head_dim == 128 and space.defaults(128) != space.defaults()
    [waiting] = _open(storage, space, problem).get_trials()
    assert waiting.system_attrs["fixed_params"] == space.defaults(128)


def test_resume_returns_the_same_study(storage, toy_space, problem):
    _open(storage, toy_space, problem)
    again = _open(storage, toy_space, problem, gpu={**GPU, "driver": "99.0", "sm_clock_mhz": 1000})  # same GPU name
    assert again.study_name == "s"
    assert len(again.get_trials()) == 1  # the default is not enqueued twice


def _tamper(storage, key, value):
    optuna.load_study(study_name="s", storage=storage).set_user_attr(key, value)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("flashtune", {"version": "9.0.0", "schema": st.SCHEMA_VERSION + 1}, "upgrade flashtune"),
        ("flashtune", {"version": "0.0.1", "schema": st.SCHEMA_VERSION - 1}, "older flashtune"),
        ("flashtune", {"version": "0.0.1"}, "older flashtune"),
        ("flashtune", "yes", "not created by flashtune"),
        ("family", "sm90", "tunes family 'sm90', not 'toy'"),
        ("space_digest", "0123456789abcdef", "knobs of toy changed"),
        ("gpu", {"name": "NVIDIA A100-SXM4-80GB"}, "measured on 'NVIDIA A100-SXM4-80GB'"),
        ("gpu", None, "measured on None"),
    ],
)
def test_resume_refuses_a_different_study(storage, toy_space, problem, key, value, match):
    _open(storage, toy_space, problem)
    _tamper(storage, key, value)
    with pytest.raises(st.StudyError, match=match):
        _open(storage, toy_space, problem)


def test_resume_refuses_another_gpu(storage, toy_space, problem):
    _open(storage, toy_space, problem)
    with pytest.raises(st.StudyError, match="NVIDIA H100"):
        _open(storage, toy_space, problem, gpu={**GPU, "name": "NVIDIA H100 80GB HBM3"})


@pytest.mark.parametrize(
    "change", [{"causal": True}, {"batch": 3}, {"seqlen_k": 1024}, {"dtype": "bf16"}, {"heads_kv": 2}]
)
def test_resume_refuses_another_problem(storage, toy_space, problem, change):
    _open(storage, toy_space, problem)
    other = Problem(**{**problem.to_dict(), **change})
    with pytest.raises(st.StudyError, match="tunes problem"):
        _open(storage, toy_space, other)


def test_resume_refuses_changed_knobs(storage, toy_space, problem, tmp_path):
    _open(storage, toy_space, problem)
    changed = tmp_path / "changed" / "toy.toml"
    changed.parent.mkdir()
    changed.write_text(toy_space_text(block_m=(32, 64, 128, 256)))
    with pytest.raises(st.StudyError, match="changed"):
        _open(storage, load_space(changed), problem)


def test_resume_refuses_another_family(storage, toy_space, problem, tmp_path):
    _open(storage, toy_space, problem)
    other = tmp_path / "other" / "toy2.toml"
    other.parent.mkdir()
    other.write_text(toy_space_text(name="toy2"))
    with pytest.raises(st.StudyError, match="tunes family 'toy'"):
        _open(storage, load_space(other), problem)


def test_resume_refuses_a_study_of_another_program(storage, toy_space, problem):
    optuna.create_study(study_name="s", storage=storage)
    with pytest.raises(st.StudyError, match="not created by flashtune"):
        _open(storage, toy_space, problem)


def test_refused_resume_changes_nothing(storage, toy_space, problem):
    study = _open(storage, toy_space, problem)
    before = (study.user_attrs, [(t.number, t.state, t.params) for t in study.get_trials()])
    with pytest.raises(st.StudyError):
        _open(storage, toy_space, problem, gpu={"name": "other"})
    after = optuna.load_study(study_name="s", storage=storage)
    assert (after.user_attrs, [(t.number, t.state, t.params) for t in after.get_trials()]) == before


def test_space_digest_depends_on_knobs_only(toy_space, tmp_path):
    same = tmp_path / "same" / "toy.toml"
    same.parent.mkdir()
    same.write_text(toy_space_text().replace('help = "keys per tile"', 'help = "reworded"'))
    assert st.space_digest(load_space(same)) == st.space_digest(toy_space)
    other = tmp_path / "other" / "toy.toml"
    other.parent.mkdir()
    other.write_text(toy_space_text(flag=(0, 1, 2)))
    assert st.space_digest(load_space(other)) != st.space_digest(toy_space)


def test_default_study_name_is_stable(toy_space):
    p = Problem(batch=8, seqlen_q=2048, heads_q=16, head_dim=128)
    name = st.default_study_name(toy_space, 90, "NVIDIA H200", p)
    assert name == "toy-sm90-nvidia-h200-fp16-d128-full-b8-h16-n2048"
    assert st.default_study_name(toy_space, 90, "NVIDIA H200", Problem(**p.to_dict())) == name
    assert (
        st.default_study_name(toy_space, 80, "NVIDIA A100-SXM4-80GB", p)
        == "toy-sm80-nvidia-a100-sxm4-80gb-fp16-d128-full-b8-h16-n2048"
    )
    assert st.default_study_name(toy_space, 90, "NVIDIA H200", Problem(**{**p.to_dict(), "causal": True})) != name


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from tuner.devices import limits_for_arch

    directory = tmp_path_factory.mktemp("tuned")
    path = directory / "toy.toml"
    path.write_text(toy_space_text())
    toy_space, problem, sm80 = (
        load_space(path),
        Problem(batch=2, seqlen_q=512, heads_q=4, head_dim=128),
        limits_for_arch(80),
    )
    with fast_dir() as db:
        storage = open_storage(f"sqlite:///{db}/studies.db")
        study = _open(storage, toy_space, problem)
        tune(
            study,
            toy_space,
            problem,
            sm80,
            FakeMeasure(),
            TuneSettings(n_trials=6, compile_workers=1),
            compiler=fake_compiler,
            search=make_search("random", toy_space, problem, sm80, 0),
        )
        yield study


def test_winner_without_retiming_is_the_best_trial(tuned):
    best = st.winner(tuned)
    complete = [t for t in tuned.get_trials() if t.state == TrialState.COMPLETE]
    top = max(complete, key=lambda t: t.value)
    assert best["source"] == "best trial"
    assert best["config"] == top.params and best["tflops"] == top.value and best["trial"] == top.number
    assert best["latency_ms"] == top.user_attrs[st.MEASUREMENT]["latency_ms"]


def test_winner_prefers_the_retimed_entry(storage, toy_space, problem):
    study = _open(storage, toy_space, problem)
    study.set_user_attr("winner", {"config": {"block_m": 32}, "tflops": 1.0, "trial": 3})
    assert st.winner(study) == {"config": {"block_m": 32}, "tflops": 1.0, "trial": 3, "source": "retimed"}


def test_a_faster_trial_after_the_retiming_makes_the_winner_stale(storage, toy_space, problem):
    study = _open(storage, toy_space, problem, name="stale")
    dists = knob_distributions(toy_space, study.user_attrs)

    def add(value, params, **attrs):
        study.add_trial(optuna.trial.create_trial(value=value, params=params, distributions=dists, user_attrs=attrs))

    top, other = toy_space.defaults(), {**toy_space.defaults(), "flag": 1}
    add(100.0, top)
    study.set_user_attr("winner", {"config": top, "tflops": 98.0, "trial": 1, "seen_trials": [1]})
    assert st.winner(study)["source"] == "retimed"
    add(90.0, other)
    assert st.winner(study)["source"] == "retimed"  # a newer but slower trial changes nothing
    add(150.0, top, **{st.DUPLICATE_OF: 1})
    assert st.winner(study)["source"] == "retimed"  # nor does a repeat of an older trial
    add(120.0, other)
    stale = st.winner(study)
    assert stale["source"] == "best trial (newer than the winner re-timed at trial 1)"
    assert stale["tflops"] == 150.0 and stale["trial"] == 3  # the best measured trial; re-timing settles it


def test_a_trial_that_finished_after_the_retiming_counts_even_with_a_lower_number(storage, toy_space, problem):
    study = _open(storage, toy_space, problem, name="late")
    dists = knob_distributions(toy_space, study.user_attrs)
    other = {**toy_space.defaults(), "flag": 1}
    study.add_trial(optuna.trial.create_trial(value=300.0, params=other, distributions=dists))  # trial 1: late
    study.add_trial(optuna.trial.create_trial(value=100.0, params=toy_space.defaults(), distributions=dists))
    # re-timed while trial 1 was still RUNNING on another host: it saw only trial 2
    study.set_user_attr("winner", {"config": toy_space.defaults(), "tflops": 99.0, "trial": 2, "seen_trials": [2]})
    stale = st.winner(study)
    assert stale["trial"] == 1 and stale["source"].startswith("best trial (newer than the winner")


def test_winner_of_an_empty_study(storage, toy_space, problem):
    assert st.winner(_open(storage, toy_space, problem)) is None


def test_default_trial(tuned, toy_space):
    t = st.default_trial(tuned)
    assert t.number == 0 and t.params == toy_space.defaults()
    assert t.value == pytest.approx(model_tflops(toy_space.defaults()))


def test_describe_lists_flashtune_studies_only(tuned):
    storage = tuned._storage
    if "not-ours" not in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        optuna.create_study(study_name="not-ours", storage=storage)
    [row] = st.describe(storage)
    assert row.name == "s" and row.family == "toy" and row.gpu == "Fake GPU"
    assert row.problem == st.study_problem(tuned).slug()
    assert row.trials == len(tuned.get_trials())
    assert row.complete == sum(t.state == TrialState.COMPLETE for t in tuned.get_trials())
    assert row.best_tflops == max(t.value for t in tuned.get_trials() if t.state == TrialState.COMPLETE)
    assert row.winner_tflops is None


def test_finished_by_config_skips_duplicates_and_unfinished(tuned):
    by_config = st.finished_by_config(tuned)
    finished = [
        t
        for t in tuned.get_trials()
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and st.DUPLICATE_OF not in t.user_attrs
    ]
    assert {t.number for t in by_config.values()} == {t.number for t in finished}
    for key, t in by_config.items():
        assert t.user_attrs[CONFIG_KEY] == key


# -- one typed reading of a study (issue 11, item 9) ----------------------------------------------------------
def test_trial_statuses_keep_the_strings_stored_before():
    stored = {
        "ok",
        "infeasible",
        "compile_error",
        "compile_timeout",
        "wrong_result",
        "launch_error",
        "timeout",
        "crashed",
        "interrupted",
        "orphaned",
    }
    assert {s.value for s in st.TrialStatus} == stored
    assert st.TrialStatus("wrong_result") == "wrong_result" and f"{st.TrialStatus.OK}" == "ok"
    assert st.INFEASIBLE_STATUSES == (
        "infeasible",
        "compile_error",
        "compile_timeout",
        "wrong_result",
        "launch_error",
        "timeout",
        "crashed",
    )
    from tuner.gpu import Status  # every measurement outcome is a trial status

    assert Status is st.TrialStatus and {s.value for s in Status} <= stored  # one vocabulary


def test_is_evaluated_counts_what_the_budget_counts():
    from optuna.distributions import CategoricalDistribution

    d = {"x": CategoricalDistribution([1, 2])}

    def trial(state, **attrs):
        value = 1.0 if state == TrialState.COMPLETE else None
        return optuna.trial.create_trial(state=state, value=value, params={"x": 1}, distributions=d, user_attrs=attrs)

    assert st.is_evaluated(trial(TrialState.COMPLETE, status="ok"))
    assert st.is_evaluated(trial(TrialState.PRUNED, status="wrong_result"))
    assert st.is_evaluated(trial(TrialState.PRUNED, status="a_status_of_a_newer_flashtune"))
    assert not st.is_evaluated(trial(TrialState.PRUNED, status="infeasible"))
    assert not st.is_evaluated(trial(TrialState.COMPLETE, status="ok", duplicate_of=0))
    assert not st.is_evaluated(trial(TrialState.COMPLETE))
    assert not st.is_evaluated(trial(TrialState.FAIL, status="interrupted"))


def test_study_meta_reads_a_study_once_and_refuses_malformed_attributes(storage, toy_space, problem):
    study = _open(storage, toy_space, problem)
    meta = st.StudyMeta.read(study)
    assert (meta.family, meta.problem, meta.gpu_name, meta.version) == ("toy", problem, "Fake GPU", __version__)
    for key, value, exc, match in [
        ("flashtune", None, st.NotFlashtuneError, "not created by flashtune"),
        ("flashtune", {"schema": True}, st.StudyError, "malformed flashtune schema"),
        ("family", "sm80\n", st.StudyError, "no valid kernel family"),
        ("problem", [1, 2], st.StudyError, "malformed problem"),
        ("problem", {**problem.to_dict(), "batch": 2**40}, st.StudyError, "malformed problem"),
    ]:
        attrs = {**study.user_attrs, key: value}
        with pytest.raises(exc, match=match):
            st.StudyMeta.from_attrs("s", attrs)


def test_a_racing_tuner_waits_for_the_creator_to_finish_the_study(storage, toy_space, problem, monkeypatch):
    """A second tuner that finds the study with only part of its attributes (the creator is still writing
    them) waits for the rest instead of calling it another program's study."""
    import threading

    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr("family", "toy")

    def finish():
        import time

        time.sleep(1.0)
        study.set_user_attr("problem", problem.to_dict())
        study.set_user_attr("gpu", GPU)
        study.set_user_attr("space_digest", st.space_digest(toy_space))
        study.set_user_attr("flashtune", {"version": __version__, "schema": st.SCHEMA_VERSION})

    creator = threading.Thread(target=finish)
    creator.start()
    resumed = _open(storage, toy_space, problem)
    creator.join()
    assert resumed.study_name == "s" and st.StudyMeta.read(resumed).family == "toy"


def test_describe_survives_a_study_with_malformed_attributes(tuned):
    storage = tuned._storage
    broken = optuna.create_study(study_name="broken", storage=storage, direction="maximize")
    for key, value in tuned.user_attrs.items():
        broken.set_user_attr(key, value)
    broken.set_user_attr("winner", "garbage")
    broken.set_user_attr("problem", "garbage")
    try:
        rows = {r.name: r for r in st.describe(storage)}
        assert rows["s"].family == "toy" and rows["broken"].problem == "?" and rows["broken"].winner_tflops is None
    finally:
        optuna.delete_study(study_name="broken", storage=storage)
