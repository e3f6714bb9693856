"""tuner.study's attribute keys: each defined once, all exported, no two the same string."""

from __future__ import annotations

import ast
from pathlib import Path

import tuner.study as study
from tuner.outcome import STATUS_ATTR
from tuner.study import _attributes

STUDY_PACKAGE = Path(study.__file__).parent


def test_every_key_is_exported_by_the_package_and_names_a_distinct_string():
    keys = {name: getattr(_attributes, name) for name in _attributes.__all__}
    assert set(keys) <= set(study.__all__)
    assert all(getattr(study, name) == value for name, value in keys.items())
    assert all(isinstance(value, str) and value for value in keys.values())
    assert len(set(keys.values())) == len(keys), "two keys name the same attribute"


def test_the_status_key_is_the_one_the_outcome_vocabulary_reads():
    assert study.STATUS == STATUS_ATTR


def test_the_keys_the_run_package_reads_are_exported():
    for name in (
        "WINNER",
        "RUN",
        "WARM_START",
        "THROUGHPUT_PREFIX",
        "MADE_BY",
        "FAMILY",
        "PROBLEM",
        "GPU",
        "SPACE_DIGEST",
        "STATUS",
        "REASON",
        "CONFIG_KEY",
        "IS_DEFAULT",
        "EXPLORATION",
        "RESOURCES",
        "COMPILE",
        "MEASUREMENT",
        "DUPLICATE_OF",
        "OWNER",
        "REQUEUED_FROM",
        "REQUEUE_COUNT",
        "REQUEUE_REASON",
    ):
        assert name in study.__all__, name


def test_no_other_module_of_the_package_defines_a_key_again():
    """A module-level string constant elsewhere in tuner/study that equals a key is a second definition."""
    values = {getattr(_attributes, name) for name in _attributes.__all__}
    again = []
    for path in sorted(STUDY_PACKAGE.glob("*.py")):
        if path.name == "_attributes.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in values:
                again.append(f"{path.name}:{node.lineno}")
    assert not again, again
