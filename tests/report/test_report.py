"""``flashtune report``: the data behind each figure, the self-contained page, and a headless browser render."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import optuna
import pytest

from tests.fake_studies import family_for_tests, make_study, open_fake_study
from tuner.cli import main
from tuner.problem import Problem
from tuner.report import (
    STUDY_FIGURES,
    build_report,
    get_contour_info,
    get_history_info,
    get_importance_info,
    get_outcomes_info,
    get_parallel_info,
    get_resources_info,
    get_suite_info,
    get_top_configs_info,
    render_report,
    study_data,
)
from tuner.space import load_space
from tuner.study import load_suite, suite_studies

FAMILY = family_for_tests()
PROBLEM = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128)
FIGURES = [name for name, (_, is_figure) in STUDY_FIGURES.items() if is_figure]


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('report')}/studies.db"


@pytest.fixture(scope="module")
def study(storage_url):
    return make_study(storage_url, "full", FAMILY, PROBLEM, n_trials=40, seed=5)


@pytest.fixture(scope="module")
def data(study):
    return study_data(study)


# -- data functions ---------------------------------------------------------------------------------
def test_study_data_reads_every_trial(study, data):
    assert len(data.rows) == len(study.trials) and data.space is not None and not data.notes
    assert data.knobs == tuple(k.name for k in load_space(FAMILY).knobs)
    assert {r.state for r in data.rows} == {"COMPLETE", "PRUNED", "FAIL"}
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(data.complete) == len(complete)
    assert data.default_tflops == next(t.value for t in complete if t.user_attrs.get("is_default"))
    assert all(r.smem_bytes is not None and r.registers is not None for r in data.complete)


def test_importances_rank_the_knobs_that_varied(data):
    info = get_importance_info(data)
    assert "PED-ANOVA" in info.importances and info.n_trials == len(data.complete)
    for values in info.importances.values():
        assert set(values) <= set(data.knobs) and sum(values.values()) == pytest.approx(1.0)
        assert list(values.values()) == sorted(values.values(), reverse=True)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        assert any("scikit-learn" in n for n in info.notes)
    else:
        assert "fANOVA" in info.importances
    # the fake TFLOPS depend most on the first knob
    assert info.ranking()[0] == data.knobs[0] or data.knobs[0] in info.ranking()[:3]


def test_importances_with_too_few_trials_give_a_note(storage_url):
    space = load_space(FAMILY)
    empty = study_data(open_fake_study(storage_url, "nothing-yet", space, PROBLEM))
    info = get_importance_info(empty)
    assert info.importances == {} and "at least 2 complete trials" in info.notes[0]
    assert get_contour_info(empty).x_knob is None and get_history_info(empty).numbers == []
    assert get_top_configs_info(empty).rows == []


def test_history_is_monotone_with_the_default_line(data):
    info = get_history_info(data)
    assert info.numbers == sorted(info.numbers) and len(info.numbers) == len(data.complete)
    assert all(b >= t for b, t in zip(info.best_so_far, info.tflops))
    assert info.best_so_far == sorted(info.best_so_far) and info.best_so_far[-1] == max(info.tflops)
    assert info.default_tflops == data.default_tflops and info.winner_tflops == data.winner["tflops"]


def test_parallel_coordinates_have_one_column_per_knob(data):
    info = get_parallel_info(data)
    assert info.knobs == list(data.knobs)
    assert all(len(info.columns[k]) == len(info.tflops) for k in info.knobs)
    space = load_space(FAMILY)
    assert all(info.tick_values[k.name] == list(k.values) for k in space.knobs)


def test_contour_uses_the_two_most_important_knobs(data):
    ranking = get_importance_info(data).ranking()
    info = get_contour_info(data, ranking)
    assert [info.x_knob, info.y_knob] == ranking[:2]
    best = max(r.tflops for r in data.complete)
    assert max(v for row in info.best for v in row if v is not None) == best
    assert sum(sum(row) for row in info.counts) == len(data.complete)
    one_knob = get_contour_info(dataclasses.replace(data, knobs=data.knobs[:1]), ranking)  # a slice
    assert one_knob.x_knob == data.knobs[0] and one_knob.y_knob is None
    assert len(one_knob.points) == len(data.complete)


def test_resources_and_top_configs(data):
    info = get_resources_info(data)
    assert len(info.registers) == len(info.tflops) == len(data.complete)
    assert "shared memory per CTA" in info.smem_label
    top = get_top_configs_info(data, top=5)
    ranked = [r for r in top.rows if r.rank is not None]
    assert [r.rank for r in ranked] == [1, 2, 3, 4, 5]
    assert [r.tflops for r in ranked] == sorted((r.tflops for r in ranked), reverse=True)
    assert ranked[0].tflops == max(r.tflops for r in data.complete)
    assert any(r.is_default for r in top.rows) and any(r.is_winner for r in top.rows)
    for r in top.rows:
        assert r.speedup_over_default == pytest.approx(r.tflops / data.default_tflops)
    assert any(r.retimed_tflops is not None for r in top.rows)


def test_outcomes_count_every_trial_with_reasons(data):
    info = get_outcomes_info(data)
    assert sum(info.counts.values()) == len(data.rows) == info.total
    assert info.counts["measured"] == len(data.complete)
    assert {"infeasible", "compile_error", "wrong_result", "failed (interrupted)"} <= set(info.counts)
    assert {o for o, _, _ in info.reasons} >= {"infeasible", "compile_error", "wrong_result"}


def test_stale_space_still_reports_with_a_note(storage_url):
    stale = make_study(storage_url, "stale", FAMILY, PROBLEM, n_trials=10, failures=False)
    stale.set_user_attr("space_digest", "0000000000000000")
    data = study_data(stale)
    assert data.space is None and "changed" in data.notes[0]
    assert set(data.knobs) <= {k.name for k in load_space(FAMILY).knobs}
    assert all(r.smem_bytes is None for r in data.rows)
    page = render_report(studies=[stale], storage_url=storage_url)
    assert "knobs of" in html.unescape(page)


def test_a_stale_retimed_winner_is_not_shown_as_the_winner(storage_url):
    from tuner.study import knob_distributions

    study = make_study(storage_url, "stale-winner", FAMILY, PROBLEM, n_trials=10, failures=False)
    assert study_data(study).winner is not None
    best = max((t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    study.add_trial(
        optuna.trial.create_trial(
            value=best.value * 4,
            params=best.params,
            distributions=knob_distributions(load_space(FAMILY), study.user_attrs),
        )
    )
    data = study_data(study)
    newest = max(t.number for t in study.get_trials())
    assert data.winner is None
    assert any(f"is stale: trial {newest} measured faster" in n for n in data.notes)
    assert "is stale" in html.unescape(render_report(studies=[study], storage_url=storage_url))


def test_throughput_of_each_run_is_read_and_shown(storage_url):
    from tuner import study as st
    from tuner.report._throughput import get_throughput_info, render_throughput

    study = make_study(storage_url, "throughput")
    assert (
        get_throughput_info(study_data(study)).rows == []
        and render_throughput(get_throughput_info(study_data(study))) is None
    )
    study.set_user_attr(
        f"{st.THROUGHPUT_PREFIX}hostb:2:2026-01-02T00:00:00",
        {
            "started": "2026-01-02T00:00:00",
            "wall_s": 100.0,
            "evaluated": 400,
            "kernel_s": 60.0,
            "measure_s": 70.0,
            "compile_wait_s": 5.0,
            "search_s": 10.0,
            "storage_s": 8.0,
        },
    )
    study.set_user_attr(
        f"{st.THROUGHPUT_PREFIX}hosta:1:2026-01-01T00:00:00",
        {"started": "2026-01-01T00:00:00", "wall_s": 50.0, "evaluated": 25, "kernel_s": "junk"},
    )
    info = get_throughput_info(study_data(study))
    assert [r.run for r in info.rows] == ["hosta:1:2026-01-01T00:00:00", "hostb:2:2026-01-02T00:00:00"]
    first, second = info.rows
    assert first.configs_per_s == 0.5 and first.gpu_busy == 0.0  # an unreadable figure counts as 0
    assert second.configs_per_s == 4.0 and second.gpu_busy == 0.6 and second.compile_wait_s == 5.0
    assert second.gpus == 1 and second.gpu_busy_measuring == pytest.approx(60 / 70)
    study.set_user_attr(
        f"{st.THROUGHPUT_PREFIX}hostc:3:2026-01-03T00:00:00",  # one loop driving two GPUs
        {
            "started": "2026-01-03T00:00:00",
            "gpus": 2,
            "wall_s": 100.0,
            "evaluated": 800,
            "kernel_s": 100.0,
            "measure_s": 160.0,
            "compile_wait_s": 20.0,
        },
    )
    third = get_throughput_info(study_data(study)).rows[2]
    assert (third.gpus, third.gpu_busy, third.measure_s, third.compile_wait_s) == (2, 0.5, 80.0, 10.0)
    table = render_throughput(get_throughput_info(study_data(study)))
    assert "4.00" in table and "60%" in table and "86%" in table and table.count("<tr>") == 4
    assert "Throughput of the tuning runs" in render_report(studies=[study], storage_url=storage_url)


# -- the page -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def page(study, storage_url) -> str:
    return render_report(studies=[study], storage_url=storage_url)


def test_page_holds_every_figure_once_with_plotly_inlined_once(page):
    for name in STUDY_FIGURES:
        assert page.count(f'<section id="study-{name}">') == 1, name
    for name in FIGURES:
        assert f'id="study-{name}-plot"' in page, name
    assert page.count("Plotly.newPlot(") == len(FIGURES)
    assert page.count('<script type="text/javascript">/**') == 1  # the plotly.js bundle, once
    assert not re.search(r"<script[^>]+src=", page), "the page must not load anything from the network"
    assert '<table class="ft-table">' in page  # top configs and reasons


def test_text_from_the_database_is_escaped(page):
    assert "</script><b>" not in page and "&lt;/script&gt;&lt;b&gt;" in page


def test_password_is_masked(study):
    page = render_report(studies=[study], storage_url="postgresql://me:hunter2@db/x")
    assert "hunter2" not in page and "me:***@db/x" in page


# -- suite page -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suite_setup(storage_url, tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "mini.toml"
    path.write_text(
        f'family = "{FAMILY}"\n[grid]\ndtype = ["fp16", "bf16"]\nhead_dim = 128\nheads = 16\n'
        "seqlen = [512, 2048, 8192]\ntokens = 16384\n"
    )
    suite = load_suite(path)
    for i, p in enumerate(suite.problems[:-1]):  # the last problem has no study yet
        make_study(storage_url, f"mini-{p.slug()}", FAMILY, p, n_trials=8, seed=10 + i, failures=False)
    return suite, path


def test_suite_heat_map_data(suite_setup, storage_url):
    suite, _ = suite_setup
    storage = optuna.storages.RDBStorage(storage_url)
    entries = [
        (e.problem, [optuna.load_study(study_name=n, storage=storage) for n in e.studies])
        for e in suite_studies(storage, suite)
    ]
    info = get_suite_info(suite.name, load_space(FAMILY), entries)
    assert len(info.columns) == len(suite.problems)
    assert [c.config is not None for c in info.columns] == [True] * (len(suite.problems) - 1) + [False]
    assert info.columns[-1].note == "no study yet"
    for c in info.columns[:-1]:
        for knob in info.knobs:
            assert 0.0 <= info.position(knob, c.config[knob]) <= 1.0


def test_suite_report_adds_the_comparison_page(suite_setup, storage_url):
    _, path = suite_setup
    text, stem = build_report(storage_url, study="full", suite_path=str(path))
    assert stem == "full" and '<section id="suite">' in text and 'id="suite-heatmap-plot"' in text
    assert '<section id="study-importance">' in text
    text, stem = build_report(storage_url, suite_path=str(path))
    assert stem == "mini" and '<section id="suite">' in text and "study-importance" not in text


# -- command line ---------------------------------------------------------------------------------
def _error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("flashtune")]
    assert len(err) == 1 and err[0].startswith("flashtune report: error: "), err
    return err[0]


def test_cli_writes_the_report(study, storage_url, tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    assert main(["report", "--study", "full", "--storage", storage_url, "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--study", "full", "--storage", storage_url]) == 0
    assert (tmp_path / "full.html").is_file()


def test_cli_errors(study, storage_url, tmp_path, capsys):
    assert main(["report", "--study", "absent", "--storage", storage_url, "-o", str(tmp_path / "x.html")]) == 2
    assert "no study named 'absent'" in _error(capsys)
    assert main(["report", "--study", "full", "--storage", storage_url, "-o", str(tmp_path / "no/x.html")]) == 2
    assert "cannot write" in _error(capsys)
    assert main(["report", "--storage", storage_url]) == 2
    assert "--study NAME and/or --suite FILE" in _error(capsys)


# -- optuna-dashboard ---------------------------------------------------------------------------------
def test_the_same_storage_opens_in_optuna_dashboard(study, storage_url):
    """optuna-dashboard's API (its WSGI app, no server) lists the study with every trial and user attribute."""
    import io
    import json

    dashboard = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    app = dashboard.wsgi(optuna.storages.RDBStorage(storage_url))

    def get(path: str) -> dict:
        status = []
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": io.StringIO(),
        }
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:300])
        return json.loads(body)

    summary = next(s for s in get("/api/studies")["study_summaries"] if s["study_name"] == "full")
    detail = get(f"/api/studies/{summary['study_id']}")
    assert len(detail["trials"]) == len(study.trials)
    assert {a["key"] for a in detail["user_attrs"]} >= {"flashtune", "family", "problem", "gpu", "winner"}


# -- headless browser ------------------------------------------------------------------------------
CHROMIUM = next(
    (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None
)


def render_in_browser(path: Path, tmp_path: Path) -> str:
    """The DOM after the page's scripts ran, dumped by headless Chromium (no network, no GPU)."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-unsafe-swiftshader",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=10000",
        "--dump-dom",
        path.resolve().as_uri(),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def rendered_ids(dom: str) -> set[str]:
    """Ids of the divs into which Plotly drew a graph (it adds a ``plot-container`` child)."""
    return {
        m.group(1)
        for m in re.finditer(
            r'<div id="([\w-]+)" class="plotly-graph-div[^"]*"[^>]*>\s*'
            r'<div class="plot-container',
            dom,
        )
    }


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_browser_renders_every_figure_without_script_errors(study, suite_setup, storage_url, tmp_path):
    _, suite_path = suite_setup
    text, _ = build_report(storage_url, study="full", suite_path=str(suite_path))
    path = tmp_path / "report.html"
    path.write_text(text)
    dom = render_in_browser(path, tmp_path)
    errors = re.search(r'data-ft-errors="(\d+)"', dom)
    assert errors is not None, "the page's closing script did not run"
    box = re.search(r'<div id="ft-errors"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert errors.group(1) == "0", html.unescape(box.group(1) if box else "")
    assert rendered_ids(dom) == {f"study-{name}-plot" for name in FIGURES} | {"suite-heatmap-plot"}
