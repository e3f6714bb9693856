"""Study suite files (``studies/*.toml``): parsing, finding their studies, and ``flashtune tune --suite``."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.fake_studies import H200_INFO, family_for_tests, fill_study, make_study, set_winner
from tuner.cli import main
from tuner.devices import limits_for_arch
from tuner.paths import REPO_ROOT
from tuner.problem import Problem
from tuner.space import load_space
from tuner.study import (
    DEFAULT_STORAGE,
    SuiteError,
    is_finished,
    load_suite,
    select_studies,
    suite_storage,
    suite_studies,
)

FAMILY = family_for_tests()
STUDIES = (REPO_ROOT or Path(__file__).resolve().parents[2]) / "studies"


def write(tmp_path: Path, text: str, name: str = "suite.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_h200_sweep_is_issue_4s_grid():
    suite = load_suite(STUDIES / "h200_sweep.toml")
    assert suite.name == "h200_sweep" and len(suite.problems) == 48
    seqlens = [512, 1024, 2048, 4096, 8192, 16384]
    assert {(p.head_dim, p.heads_q, p.dtype, p.causal, p.seqlen_q) for p in suite.problems} == {
        (d, h, t, c, n)
        for d, h in ((128, 16), (64, 32))
        for t in ("fp16", "bf16")
        for c in (False, True)
        for n in seqlens
    }
    for p in suite.problems:
        assert p.batch * p.seqlen_q == 16384 and p.heads_q == p.heads_kv
        assert p.seqlen_k == p.seqlen_q


def test_several_grids(tmp_path):
    path = write(
        tmp_path,
        f'''family = "{FAMILY}"
[[grid]]
head_dim = 128
heads = 16
seqlen = [1024, 2048]
batch = 2
[[grid]]
head_dim = 64
heads = 32
seqlen = 1024
batch = 2
''',
    )
    suite = load_suite(path)
    assert [(p.head_dim, p.heads_q, p.seqlen_q) for p in suite.problems] == [
        (128, 16, 1024),
        (128, 16, 2048),
        (64, 32, 1024),
    ]


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_suite_loads(path):
    assert load_suite(path).problems


@pytest.mark.parametrize("path", sorted((STUDIES.parent / "tests" / "gpu").glob("*.toml")), ids=lambda p: p.name)
def test_every_device_benchmark_suite_loads_and_its_problems_run_with_their_defaults(path):
    """The suites that tests/gpu/bench_sm90.py times on a device: a broken one would cost a device call."""
    suite = load_suite(path)
    space, device = load_space(suite.family), limits_for_arch(90)
    assert suite.problems
    for problem in suite.problems:
        assert space.check(space.defaults(problem=problem, device=device), problem, device) is None, problem.slug()


def test_grid_and_listed_problems_are_merged_without_repeats(tmp_path):
    path = write(
        tmp_path,
        f'''
family = "{FAMILY}"
description = "test"
[grid]
causal = [false, true]
head_dim = 64
heads = 8
seqlen = [256, 1024]
batch = 2
[[problems]]
head_dim = 64
heads = 8
seqlen = 256
batch = 2
[[problems]]
dtype = "bf16"
head_dim = 128
heads = 32
kv_heads = 8
seqlen = 100
seqlen_k = 300
tokens = 200
''',
    )
    suite = load_suite(path)
    assert suite.storage is None and suite.family == FAMILY and suite.description == "test"
    assert len(suite.problems) == 5  # 4 from the grid; the first listed one repeats a grid problem
    assert suite.problems[0] == Problem(batch=2, seqlen_q=256, heads_q=8, head_dim=64)
    assert suite.problems[-1] == Problem(
        batch=2, seqlen_q=100, seqlen_k=300, heads_q=32, heads_kv=8, head_dim=128, dtype="bf16"
    )


BASE = "head_dim = 128\nheads = 16\nseqlen = 1024\nbatch = 2\n"


@pytest.mark.parametrize(
    "text, match",
    [
        ("[grid]\n" + BASE, "missing family"),
        ('family = "nope"\n[grid]\n' + BASE, "unknown kernel family"),
        (f'family = "{FAMILY}"\n', "names no problem"),
        (f'family = "{FAMILY}"\ntrials = 3\n[grid]\n' + BASE, "unknown key"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE + "colour = 1\n", "unknown key"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE.replace("1024", '"1024"'), "seqlen must be an integer"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE + "causal = 1\n", "causal must be true or false"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE + "tokens = 4096\n", "exactly one of batch and tokens"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE.replace("batch = 2", "tokens = 1000"), "not a positive multiple"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE.replace("128", "96"), "supports head dims"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE + 'dtype = "fp32"\n', "dtype must be one of"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE.replace("1024", "[]"), "empty list"),
        (f'family = "{FAMILY}"\n[[problems]]\n' + BASE.replace("1024", "[1, 2]"), "single values"),
        (f'family = "{FAMILY}"\n[grid]\n' + BASE + "kv_heads = 3\n", "must divide heads_q"),
        ("family = [", "not valid TOML"),
        (f'family = "{FAMILY}"\ngrid = 3\n', "grid must be a table"),
        (f'family = "{FAMILY}"\n[[grid]]\n' + BASE + "seqlen_k = []\n", r"\[\[grid\]\] #1: seqlen_k is an empty list"),
    ],
)
def test_malformed_suites_are_refused_naming_the_file(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(SuiteError, match=match) as info:
        load_suite(path)
    assert str(path) in str(info.value)


def test_missing_suite_file(tmp_path):
    with pytest.raises(SuiteError, match="no such suite file"):
        load_suite(tmp_path / "absent.toml")


def test_storage_precedence(tmp_path):
    with_storage = load_suite(write(tmp_path, f'family = "{FAMILY}"\nstorage = "sqlite:///x.db"\n[grid]\n' + BASE))
    without = load_suite(write(tmp_path, f'family = "{FAMILY}"\n[grid]\n' + BASE, "b.toml"))
    assert suite_storage(with_storage, DEFAULT_STORAGE) == "sqlite:///x.db"
    assert suite_storage(with_storage, None) == "sqlite:///x.db"
    assert suite_storage(with_storage, "sqlite:///y.db") == "sqlite:///y.db"
    assert suite_storage(without, None) == DEFAULT_STORAGE
    assert suite_storage(None, None) == DEFAULT_STORAGE


def test_studies_of_a_suite_are_found_by_problem(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    suite = load_suite(
        write(
            tmp_path, f'family = "{FAMILY}"\n[grid]\nhead_dim = 128\nheads = 16\nseqlen = [512, 1024]\ntokens = 4096\n'
        )
    )
    make_study(url, "a-512", FAMILY, suite.problems[0], n_trials=4, failures=False)
    make_study(url, "other-problem", FAMILY, Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=128), n_trials=4)
    storage = optuna.storages.RDBStorage(url)
    found = suite_studies(storage, suite)
    assert [(e.problem, e.studies) for e in found] == [(suite.problems[0], ("a-512",)), (suite.problems[1], ())]
    assert select_studies(storage, suite=suite) == ["a-512"]
    assert select_studies(storage, pattern="*-problem") == ["other-problem"]
    assert select_studies(storage, pattern="a-*", suite=suite) == ["a-512"]
    assert select_studies(storage, pattern="zzz*", suite=suite) == []
    with pytest.raises(SuiteError):
        select_studies(storage)


def test_is_finished_needs_the_trial_target_and_a_winner(tmp_path):
    url = f"sqlite:///{tmp_path}/f.db"
    storage = optuna.storages.RDBStorage(url)
    p = Problem(batch=2, seqlen_q=512, heads_q=4, head_dim=128)
    make_study(url, "done", FAMILY, p, n_trials=10, failures=True)
    make_study(url, "no-winner", FAMILY, p, n_trials=10, winner=False)
    trials = optuna.load_study(study_name="done", storage=storage).trials
    evaluated = sum(1 for t in trials if t.user_attrs.get("status") in ("ok", "compile_error", "wrong_result"))
    assert is_finished(storage, "done", 3)
    assert not is_finished(storage, "done", evaluated + 1)
    assert not is_finished(storage, "done", None)
    assert not is_finished(storage, "no-winner", 1)
    assert not is_finished(storage, "absent", 1)

    done = optuna.load_study(study_name="done", storage=storage)  # a faster trial after the re-timing
    best = max((t for t in done.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    done.add_trial(
        optuna.trial.create_trial(
            value=best.value * 3, params=best.params, distributions=best.distributions, user_attrs={"status": "ok"}
        )
    )
    assert not is_finished(storage, "done", 3)  # the stale winner is re-timed on the next run


# -- flashtune tune --suite ------------------------------------------------------------------------
@pytest.fixture
def fake_gpu_run(monkeypatch):
    """Replace what needs a GPU under ``flashtune tune`` (device query, the measuring run, re-timing) by fakes
    that fill the study with fake trials; everything else (suite, study names, storage, resuming) is real."""
    import tuner.cli._main
    import tuner.run._run

    runs: list[str] = []

    def run_on_gpu(run, gpu, label="", *, workers=None, pool=None):
        spec = run.spec
        runs.append(spec.study_name)
        study = optuna.load_study(study_name=spec.study_name, storage=optuna.storages.RDBStorage(spec.storage_url))
        fill_study(
            study,
            load_space(spec.family),
            spec.problem,
            n_trials=spec.settings.n_trials,
            seed=len(runs),
            failures=False,
        )
        return []

    class NoWorker:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def retime_winner(run, gpu, *, top_k, rounds, worker=None):
        spec = run.spec
        study = optuna.load_study(study_name=spec.study_name, storage=optuna.storages.RDBStorage(spec.storage_url))
        set_winner(study, load_space(spec.family), spec.problem)
        return study

    monkeypatch.setattr(tuner.run, "gpu_infos", lambda gpus: [dict(H200_INFO) for _ in gpus])
    monkeypatch.setattr(tuner.run._run, "run_on_gpu", run_on_gpu)
    monkeypatch.setattr(tuner.run._run, "Worker", NoWorker)
    monkeypatch.setattr(tuner.run._run, "retime_winner", retime_winner)
    return runs


def test_tune_suite_runs_every_problem_then_resumes(tmp_path, fake_gpu_run, capsys):
    url = f"sqlite:///{tmp_path}/suite.db"
    path = write(
        tmp_path,
        f'family = "{FAMILY}"\nstorage = "{url}"\n[grid]\ndtype = ["fp16", "bf16"]\n'
        "causal = [false, true]\nhead_dim = 128\nheads = 16\nseqlen = 1024\nbatch = 2\n",
    )
    suite = load_suite(path)
    assert main(["tune", "--suite", str(path), "--trials", "4", "--top-k", "1"]) == 0
    assert len(fake_gpu_run) == 4 and len(set(fake_gpu_run)) == 4
    storage = optuna.storages.RDBStorage(url)  # the suite's storage: no --storage was given
    found = suite_studies(storage, suite)
    assert [e.studies for e in found] == [(name,) for name in fake_gpu_run]
    assert all(is_finished(storage, name, 4) for name in fake_gpu_run)

    capsys.readouterr()
    assert main(["tune", "--suite", str(path), "--trials", "4"]) == 0  # everything is done: nothing runs
    assert len(fake_gpu_run) == 4
    assert capsys.readouterr().err.count("is finished, skipped") == 4

    assert main(["tune", "--suite", str(path), "--trials", "30"]) == 0  # a larger target resumes each study
    assert fake_gpu_run[4:] == fake_gpu_run[:4]


def test_tune_suite_errors(tmp_path, fake_gpu_run, capsys):
    path = write(tmp_path, f'family = "{FAMILY}"\n[grid]\n' + BASE)
    assert main(["tune", "--suite", str(path), "--study", "x"]) == 2
    assert main(["tune", "--suite", str(tmp_path / "absent.toml")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flashtune")]
    assert len(err) == 2 and "--study names one study" in err[0] and "no such suite file" in err[1]
    assert fake_gpu_run == []


def test_a_new_study_of_a_suite_starts_from_the_winners_of_tuned_shapes(tmp_path, fake_gpu_run):
    from tuner import study as st

    url = f"sqlite:///{tmp_path}/suite.db"
    path = write(
        tmp_path,
        f'family = "{FAMILY}"\nstorage = "{url}"\n[grid]\ndtype = "fp16"\ncausal = [false, true]\n'
        "head_dim = 128\nheads = 16\nseqlen = [1024, 4096]\nbatch = 2\n",
    )
    assert main(["tune", "--suite", str(path), "--trials", "4", "--top-k", "1"]) == 0
    storage = optuna.storages.RDBStorage(url)
    first = optuna.load_study(study_name=fake_gpu_run[0], storage=storage)
    assert first.user_attrs[st.WARM_START] == ["none"]  # nothing was tuned before it
    for i, name in enumerate(fake_gpu_run[1:], 1):
        study = optuna.load_study(study_name=name, storage=storage)
        sources = [s for s in study.user_attrs[st.WARM_START] if s != "none"]
        assert set(sources) <= set(fake_gpu_run[:i])  # only shapes tuned before it
        enqueued = {t.user_attrs[st.WARM_START]: t for t in study.get_trials() if t.user_attrs.get(st.WARM_START)}
        assert sorted(enqueued) == sorted(sources)
        for source, trial in enqueued.items():
            won = st.winner(optuna.load_study(study_name=source, storage=storage))
            assert trial.system_attrs["fixed_params"] == won["config"]


def test_warm_start_takes_the_nearest_shapes_winners_of_the_same_family_gpu_dtype_and_head_dim(tmp_path):
    import random

    from tests.fake_studies import gpu_for, open_fake_study
    from tuner.devices import DeviceLimits
    from tuner.run import warm_start_configs

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/w.db")
    space = load_space(FAMILY)
    device = DeviceLimits.from_info(gpu_for(space))
    target = Problem(batch=2, seqlen_q=4096, heads_q=16, head_dim=128, dtype="fp16", causal=True)
    rng = random.Random(0)
    winners = {}

    def tuned(name, **shape):
        problem = Problem(
            **{"batch": 2, "seqlen_q": 4096, "heads_q": 16, "head_dim": 128, "dtype": "fp16", "causal": True, **shape}
        )
        study = open_fake_study(storage, name, space, problem)
        while True:  # a feasible, non-default config of its own
            config = {k.name: rng.choice(k.values) for k in space.knobs}
            if (
                space.check(config, target, device) is None
                and config != space.defaults(128)
                and config not in winners.values()
            ):
                break
        winners[name] = config
        study.set_user_attr("winner", {"config": config, "tflops": 100.0, "trial": 0})

    tuned("causal-n1024", seqlen_q=1024)  # same causal flag, 4x shorter
    tuned("full-n4096", causal=False)  # same length, other causal flag
    tuned("causal-n16384", seqlen_q=16384)  # same causal flag, 4x longer (tie with n1024)
    tuned("causal-n2048", seqlen_q=2048)  # same causal flag, 2x shorter: the nearest
    tuned("bf16-causal-n4096", dtype="bf16")  # other dtype: never
    tuned("d64-causal-n4096", head_dim=64, heads_q=32)  # other head dim: never

    chosen = warm_start_configs(storage, space, target, device, gpu_for(space)["name"], limit=3)
    names = [name for name, _ in chosen]
    assert names[0] == "causal-n2048" and set(names[1:]) == {"causal-n1024", "causal-n16384"}
    assert all(config == winners[name] for name, config in chosen)
    everything = warm_start_configs(storage, space, target, device, gpu_for(space)["name"], limit=10)
    assert [n for n, _ in everything][3:] == ["full-n4096"]
    assert warm_start_configs(storage, space, target, device, "Another GPU", limit=3) == []
