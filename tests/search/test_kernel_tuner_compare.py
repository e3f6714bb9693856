"""tests/search/kernel_tuner_compare.py: the Kernel Tuner cache it writes for a stored sweep, its figures, and (where
Kernel Tuner is installed apart, on PYTHONPATH) one seeded simulation-mode run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from tests.search import kernel_tuner_compare as ktc
from tuner.space import config_key

SWEEP = "small-bf16-full-n2048"  # 620 feasible configs of 6,144 grid points


@pytest.fixture(scope="module")
def oracle():
    return ktc.load_sweep(SWEEP)


@pytest.fixture(scope="module")
def cache(oracle, tmp_path_factory):
    return ktc.write_cache(oracle, tmp_path_factory.mktemp("kt") / f"{SWEEP}.json")


def test_the_cache_holds_every_feasible_config_of_the_sweep_once_with_a_positive_time(oracle, cache):
    document = json.loads(cache.read_text())
    names = document["tune_params_keys"]
    assert names == [k.name for k in oracle.space.knobs]
    assert document["tune_params"] == {k.name: list(k.values) for k in oracle.space.knobs}
    assert {"device_name", "kernel_name", "problem_size", "objective", "cache"} <= document.keys()
    entries = document["cache"]
    assert len(entries) == len(oracle.results) == 620
    stored = set()
    for key, entry in entries.items():
        config = {name: entry[name] for name in names}
        assert key == ",".join(str(config[name]) for name in names)
        assert entry["time"] > 0
        assert {"times", "compile_time", "verification_time", "benchmark_time"} <= entry.keys()
        stored.add(config_key(config))
    assert stored == set(oracle.results)  # every config of the sweep, none twice, none outside it


def test_the_caches_fastest_config_is_the_sweeps_best(oracle, cache):
    entries = json.loads(cache.read_text())["cache"]
    fastest = min(entries.values(), key=lambda e: e["time"])
    assert fastest["tflops"] == oracle.best
    slowest = max(entries.values(), key=lambda e: e["time"])
    assert slowest["tflops"] == min(v for v in oracle.results.values() if v is not None)


def test_evaluations_to_1_percent_on_hand_made_runs():
    runs = [
        [90.0, None, 98.9, 99.0, 100.0],  # 99.0 is within 1% of 100: the 4th evaluation
        [99.5],  # the first
        [50.0, 97.0, 98.5],  # within 2% at the 3rd, never within 1%
    ]
    row = ktc.figures(runs, best=100.0)
    assert row["to_1%"]["per_seed"] == [4.0, 1.0, math.inf]
    assert row["to_1%"]["median"] == 4.0
    assert row["to_1%"]["p90"] == math.inf
    assert row["to_1%"]["never"] == 1
    assert row["to_2%"]["per_seed"] == [3.0, 1.0, 3.0]
    assert row["to_5%"]["per_seed"] == [3.0, 1.0, 2.0]
    assert row["best_at_25"] == 0.995  # the median of 1.0, 0.995 and 0.985


def test_best_after_25_reads_only_the_first_25_evaluations():
    assert ktc.figures([[90.0] * 25 + [100.0]], best=100.0)["best_at_25"] == 0.9


def test_pattern_beats_only_with_a_lower_median_and_p90_than_every_kernel_tuner_strategy():
    def row(median, p90):
        return {"to_1%": {"median": median, "p90": p90, "never": 0}}

    result = {"rows": {"pattern": row(5, 7), "kt:a": row(5, 20), "kt:b": row(8, 8)}}
    assert ktc.best_kt(result["rows"]) == "kt:a"
    assert "DOES NOT BEAT" in ktc.verdict(result)  # a's median is as low
    result["rows"]["pattern"] = row(4, 9)
    assert "DOES NOT BEAT" in ktc.verdict(result)  # b's p90 is lower
    result["rows"]["pattern"] = row(4, 7)
    assert "BEATS Kernel Tuner's best here: median to 1% 4 vs 5 (a), p90 7 vs 8 (b)" in ktc.verdict(result)


def test_without_kernel_tuner_the_script_says_how_to_install_it_and_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "kernel_tuner", None)  # import kernel_tuner raises ImportError
    with pytest.raises(SystemExit) as exit:
        ktc.main(["--seeds", "1", "--sweeps", SWEEP])
    assert exit.value.code == 2
    assert "pip install --target" in capsys.readouterr().err


needs_kernel_tuner = pytest.mark.skipif(
    importlib.util.find_spec("kernel_tuner") is None,
    reason=ktc.INSTALL + " (it is no dependency of flashtune)",
)


@needs_kernel_tuner
@pytest.mark.parametrize("strategy", ["greedy_ils", "genetic_algorithm"])
def test_a_seeded_kernel_tuner_run_evaluates_sweep_configs_within_its_budget_and_repeats(cache, oracle, strategy):
    first, _ = ktc.kt_run(str(cache), strategy, 3, 12)
    assert 0 < len(first) <= 12
    assert all(v in set(oracle.results.values()) for v in first)
    assert ktc.kt_run(str(cache), strategy, 3, 12)[0] == first
    assert ktc.kt_run(str(cache), strategy, 4, 12)[0] != first


@needs_kernel_tuner
def test_a_kernel_tuner_runs_evaluations_are_its_unique_configs_in_order_without_invalid_ones():
    from kernel_tuner.util import InvalidConfig

    params = {"a": [1, 2], "b": [3]}
    tflops = {"1,3": 10.0, "2,3": 20.0}
    results = [{"a": 2, "b": 3}, {"a": 1, "b": 3, "__error__": InvalidConfig()}, {"a": 2, "b": 3}, {"a": 1, "b": 3}]
    assert ktc.kt_values(results, params, tflops) == [20.0, 10.0]
