"""tuner.bench and `flashtune bench`: one config, or a study's winner on the study's own problem,
against the peers (a stand-in GPU handler and compiler; the real study storage and worker process)."""

from __future__ import annotations

import io

import pytest

import tuner.bench
from tests.fake_studies import H200_INFO, make_study
from tests.fakes.fake_gpu import FakeGpu
from tests.fakes.standin_tuner import standin_compile, standin_tflops
from tuner.bench import _bench as bench
from tuner.bench import run_bench, study_for_bench
from tuner.cli import main
from tuner.gpu import MeasureSettings
from tuner.problem import Problem
from tuner.run import Worker
from tuner.space import load_space
from tuner.study import StudyError, winner

HANDLER = FakeGpu
STUDY_PROBLEM = Problem(batch=2, seqlen_q=4096, heads_q=32, head_dim=64, dtype="bf16", causal=True)


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('bench')}/s.db"
    make_study(url, "d64", "sm80", STUDY_PROBLEM, n_trials=12, failures=False)
    return url


def test_a_study_is_benched_on_its_own_family_problem_and_winner(storage_url):
    import optuna

    family, problem, config = study_for_bench("d64", storage_url)
    assert (family, problem) == ("sm80", STUDY_PROBLEM)
    assert config == winner(optuna.load_study(study_name="d64", storage=storage_url))["config"]


def test_an_unknown_study_is_a_usage_error_that_says_where_to_look(storage_url):
    with pytest.raises(StudyError, match=r"no study named .nope..*flashtune studies"):
        study_for_bench("nope", storage_url)


def test_run_bench_times_the_given_problem_beside_the_peers(storage_url, monkeypatch):
    monkeypatch.setattr(bench, "compile_outcome", standin_compile)
    family, problem, config = study_for_bench("d64", storage_url)
    out = io.StringIO()
    with Worker(handler=HANDLER) as worker:
        info = worker.device_info()
        rows = run_bench(worker, info, family, problem, config=config, out=out)
    assert rows[0]["name"] == "flashtune_sm80" and rows[0]["tflops"] == pytest.approx(standin_tflops(config))
    assert {r["name"] for r in rows[1:]} >= {"sdpa_cudnn_attention", "sdpa_flash_attention", "cublas_gemm_8192"}
    text = out.getvalue()
    assert text.startswith(f"{STUDY_PROBLEM.slug()} on Stand-in GPU")
    assert "config: " + ", ".join(f"{k}={v}" for k, v in config.items()) in text


def test_bench_checks_the_config_on_inputs_of_its_own(storage_url, monkeypatch):
    monkeypatch.setattr(bench, "compile_outcome", standin_compile)
    family, problem, config = study_for_bench("d64", storage_url)
    jobs = []
    with Worker(handler=HANDLER) as worker:
        measure = worker.measure
        monkeypatch.setattr(worker, "measure", lambda job, **kw: jobs.append(job) or measure(job, **kw))
        run_bench(
            worker,
            worker.device_info(),
            family,
            problem,
            config=config,
            out=io.StringIO(),
            settings=MeasureSettings(check=False, seed=5),
        )
    assert [(j.settings.check, j.settings.fresh_inputs, j.settings.seed) for j in jobs] == [(True, True, 5)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--config", "block_m=64"], "drop --config"),
        (["--seqlen", "1024"], "own problem and family; drop --seqlen"),
        (["--family", "sm90", "--causal"], "drop --family --causal"),
    ],
)
def test_study_with_a_config_or_problem_flags_is_refused(storage_url, capsys, extra, message):
    assert main(["bench", "--study", "d64", "--storage", storage_url, *extra]) == 2
    assert message in capsys.readouterr().err


def test_an_explicit_config_takes_the_head_dim_s_defaults_for_missing_knobs(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr("tuner.cli._gpus.start_worker", lambda gpu: (Worker(handler=HANDLER), H200_INFO))

    def fake_run_bench(worker, info, family, problem, *, config, out):
        seen.update(family=family, problem=problem, config=config)
        return []

    monkeypatch.setattr(tuner.bench, "run_bench", fake_run_bench)  # the entrance the CLI calls
    assert main(["bench", "--family", "sm80", "--head-dim", "64", "--config", "block_n=32"]) == 0
    assert seen["problem"].head_dim == 64 and seen["family"] == "sm80"
    assert seen["config"] == load_space("sm80").validate({"block_n": 32}, partial=True, head_dim=64)


@pytest.mark.parametrize("family", [["--family", "sm90"], []], ids=["sm90", "auto"])
def test_a_partial_config_moves_the_defaults_it_cannot_run_with_and_says_so(monkeypatch, capsys, family):
    """--config persistent=0 on an H200 (the family auto picks there: sm90): the default scheduler=1 orders
    persistent CTAs only, so the bench times the static order, and one line on stderr says so."""
    seen = {}
    monkeypatch.setattr("tuner.cli._gpus.start_worker", lambda gpu: (Worker(handler=HANDLER), H200_INFO))
    monkeypatch.setattr(tuner.bench, "run_bench", lambda *a, config, out: seen.update(config=config) or [])
    assert main(["bench", *family, "--config", "persistent=0"]) == 0
    space = load_space("sm90")
    assert seen["config"] == {**space.defaults(128, 90), "persistent": 0, "scheduler": 0}
    err = capsys.readouterr().err
    assert "flashtune: sm90: the default scheduler=1 cannot run fp16-d128-full-b8-h16-n2048 on NVIDIA H200" in err
    assert "took scheduler=0, the nearest completion that runs" in err


def test_given_knobs_that_conflict_are_refused_before_a_gpu_starts(monkeypatch, capsys):
    def no_gpu(gpu):
        raise AssertionError("a GPU was started for a config that cannot run")

    monkeypatch.setattr("tuner.cli._gpus.start_worker", no_gpu)
    assert main(["bench", "--family", "sm90", "--config", "persistent=0,q_stages=1"]) == 2
    err = capsys.readouterr().err
    assert "sm90: --config persistent=0, q_stages=1 cannot run fp16-d128-full-b8-h16-n2048: q_stages_persistent" in err
    assert "dynamic_scheduler" not in err  # the scheduler's default is moved, not a conflict
    assert main(["bench", "--config", "persistent=0,q_stages=1"]) == 2  # auto: no family takes it
    err = capsys.readouterr().err
    assert "fits no family" in err and "sm80: unknown knob(s) persistent, q_stages" in err
    assert "q_stages_persistent" in err


def test_suite_output_is_checked_before_the_gpu_run(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text('family = "sm80"\n[grid]\nhead_dim = 128\nheads = 2\nbatch = 1\nseqlen = 128\n')
    assert main(["bench", "--suite", str(suite), "-o", str(tmp_path / "missing" / "t.md")]) == 2
    assert f"folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main(["bench", "--suite", str(suite), "-o", str(tmp_path / "t.json")]) == 2
    assert "give a .md name" in capsys.readouterr().err
