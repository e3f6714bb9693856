"""parse_tuned_json on a dispatch JSON with any value anywhere replaced: the tables, or one TunedError
(config="auto" users see its message), never a TypeError or KeyError from inside."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.fake_studies import make_study
from tuner.export import collect_dispatch
from tuner.serve import TunedError, parse_tuned_json

HOSTILE: list[Any] = [None, True, -1, 1.5, 1e308, "", "fp16", "x" * 300, [], ["fp16"], {}, {"a": 1}, [[[]]]]


@pytest.fixture(scope="module")
def dispatch(tmp_path_factory) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('tuned')}/s.db"
    make_study(url, "tuned", n_trials=6, failures=False)
    return json.loads(collect_dispatch(url, pattern="*").json())


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in the document: keys of objects, indexes of lists."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*path, index))
    return out


def _replaced(document: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    changed = copy.deepcopy(document)
    target = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return changed


def test_the_written_json_reads_back(dispatch):
    assert parse_tuned_json(json.dumps(dispatch), "tuned.json").tables


def test_any_value_anywhere_is_the_tables_or_one_tuned_error(dispatch):
    paths = _paths(dispatch)
    assert any(path and path[-1] == "dtype" for path in paths)  # the walk reaches the entries
    for path in paths:
        for value in HOSTILE:
            text = json.dumps(_replaced(dispatch, path, value))
            try:
                parse_tuned_json(text, "tuned.json")
            except TunedError as e:
                assert "\n" not in str(e) and str(e).startswith("tuned.json"), (path, value, e)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deeply_nested_json_is_one_error(depth):
    with pytest.raises(TunedError, match=r"tuned\.json"):
        parse_tuned_json("[" * depth + "]" * depth, "tuned.json")
