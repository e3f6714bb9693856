"""flashtune replay: the real tuning loop measured by a stored exhaustive study (tests/data/)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest

from tests.gpu.measure_sweeps import SWEEPS
from tuner.cli import main
from tuner.run import ReplayError, load_oracle, replay, replay_one, summarize
from tuner.space import config_key
from tuner.study import open_storage

DATA = Path(__file__).resolve().parents[1] / "data"
URL = f"sqlite:///{DATA / 'h200_sm90_small_grid.db'}"
SPACE = DATA / "sm90_small.toml"


@pytest.fixture(scope="module")
def oracle():
    return load_oracle(optuna.storages.RDBStorage(URL), "grid-small", SPACE)


def test_the_oracle_holds_every_feasible_config_of_the_sweep(oracle):
    assert len(oracle.results) == 620 and all(v is not None for v in oracle.results.values())
    assert oracle.best == pytest.approx(583.578868, rel=1e-6)
    assert oracle.problem.slug() == "fp16-d128-causal-b4-h16-n4096"
    default = oracle.results[config_key(oracle.space.defaults(128))]
    assert default / oracle.best == pytest.approx(0.967, abs=1e-3)


@pytest.mark.parametrize("sampler", ["pattern", "tpe", "random", "grid"])
def test_a_replayed_run_measures_the_default_first_then_distinct_configs_from_the_oracle(oracle, sampler):
    run = replay_one(oracle, sampler, seed=1, budget=40)
    assert len(run.values) == 40
    assert run.values[0] == oracle.results[config_key(oracle.space.defaults(128))]
    assert all(v in oracle.results.values() for v in run.values)
    assert run.best_after(40) == max(run.values) and run.best_after(1) == run.values[0]
    hit = run.evaluations_to(max(run.values))
    assert hit is not None and run.values[hit - 1] == max(run.values)
    assert run.evaluations_to(oracle.best * 2) is None


@pytest.mark.parametrize("window", [1, 17])
def test_a_replay_starts_from_the_problems_default_as_a_real_study_does(window):
    """On a space whose ``[[defaults]]`` rules change the default for the problem, the replayed study enqueues
    the default the search starts from (the problem's, which needs the device's limits), not the head dim's:
    a real study's GPU information carries those limits."""
    name = "d64-bf16-causal-b32-h12-n512"
    sweep = next(s for s in SWEEPS if s.name == name)
    oracle = load_oracle(open_storage(f"sqlite:///{DATA / sweep.db}", create=False), sweep.study, sweep.space_file)
    default = oracle.space.defaults(problem=oracle.problem, device=oracle.device)
    assert default != oracle.space.defaults(oracle.problem.head_dim)  # the rules matter at this shape
    run = replay_one(oracle, "pattern", seed=0, budget=window + 2, window=window)
    assert run.values[0] == oracle.results[config_key(default)]
    assert f"default {oracle.results[config_key(default)] / oracle.best:.3f} of it" in oracle.describe()


def test_replay_is_reproducible_for_a_seed(oracle):
    assert replay_one(oracle, "tpe", 3, 30).values == replay_one(oracle, "tpe", 3, 30).values


def test_replays_with_the_same_seed_in_two_processes_give_the_same_figures(oracle):
    """Every random choice of a run follows its seed, the loop's own draws (exploring when the search has
    nothing new) included: nothing depends on the process (its id, say)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    def in_a_new_process():
        with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
            return pool.submit(replay_one, oracle, "tpe", 3, 45).result(timeout=300)

    first, second = in_a_new_process(), in_a_new_process()
    assert first.explorations > 0  # the loop drew configs of its own
    assert (first.values, first.asks, first.repeats, first.explorations) == (
        second.values,
        second.asks,
        second.repeats,
        second.explorations,
    )


def test_compile_ahead_makes_proposals_before_earlier_results_are_known(oracle):
    run = replay_one(oracle, "random", seed=2, budget=30, window=8)
    assert len(run.values) == 30 and len(set(run.values)) == 30


def test_summary_counts_evaluations_to_each_threshold(oracle):
    runs = replay(oracle, ["grid"], range(3), 620)  # the whole space: every run finds the best
    rows = summarize(oracle, runs)
    assert len(rows) == 1 and rows[0]["runs"] == 3
    assert rows[0]["to_1%"]["never"] == 0 and 1 <= rows[0]["to_1%"]["median"] <= 620
    assert rows[0]["to_5%"]["median"] <= rows[0]["to_2%"]["median"] <= rows[0]["to_1%"]["median"]
    assert rows[0]["best_at_100"] <= 1.0
    short = summarize(oracle, replay(oracle, ["grid"], range(3), 5))
    assert short[0]["to_1%"]["never"] <= 3 and (short[0]["to_1%"]["never"] == 0 or math.isinf(short[0]["to_1%"]["p90"]))


def test_the_command_prints_a_table_and_json(capsys):
    args = [
        "replay",
        "--storage",
        URL,
        "--study",
        "grid-small",
        "--space",
        str(SPACE),
        "--seeds",
        "2",
        "--budget",
        "15",
        "--jobs",
        "1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "620 measured configs" in out and "within 1%" in out
    assert [line.split()[0] for line in out.splitlines()[3:]] == ["pattern", "tpe", "random", "grid"]
    assert main([*args, "--json", "--samplers", "random"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["budget"] == 15 and [r["sampler"] for r in data["rows"]] == ["random"]


def test_bad_replays_are_one_line_errors(tmp_path, capsys):
    assert main(["replay", "--storage", URL, "--study", "nope", "--space", str(SPACE)]) == 2
    assert main(["replay", "--storage", URL, "--study", "grid-small"]) == 2  # family sm90_small is not shipped
    assert main(["replay", "--storage", URL, "--study", "grid-small", "--space", str(SPACE), "--samplers", "x"]) == 2
    assert main(["replay", "--storage", URL, "--study", "grid-small", "--space", str(SPACE), "--seeds", "0"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flashtune")]
    assert len(err) == 4
    assert "no study named 'nope'" in err[0] and "--space FILE" in err[1] and "unknown sampler 'x'" in err[2]


def test_a_study_that_lacks_a_config_cannot_answer_for_it(oracle, tmp_path):
    partial = dict(list(oracle.results.items())[:50])
    small = type(oracle)(oracle.study_name, oracle.space, oracle.problem, oracle.device, partial)
    with pytest.raises(ReplayError, match="never measured config"):
        replay_one(small, "grid", seed=0, budget=200)
