"""No output of a command is one of its inputs: what each command reads, checked against its ``-o``.

A command's inputs are its study database (with its ``-wal``, ``-journal`` and ``-shm`` files),
the storage its suite names, the suite file, a space file (``--space``, a ``--family`` path, the
suite's family), a ``--tuned`` file and a ``--config`` header. :func:`guard` notes them as the
command's inputs (so :func:`tuner.files.write_text` refuses them at writing too, with every file
read on the way) and refuses an output that is one of them before any work is done.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..files import Input, guard_outputs, note_input

__all__ = ["command_inputs", "guard"]


def _storage_inputs(url: str | None, label: str) -> list[Input]:
    from ..study import sqlite_files

    files = sqlite_files(url)
    if not files:
        return []
    database, *journals = files
    return [Input(label, str(database)), *(Input(f"a journal of {label}", str(j)) for j in journals)]


def _file_option(value: object) -> bool:
    return (
        isinstance(value, str) and bool(value) and "://" not in value and Path(value).suffix in (".toml", ".json", ".h")
    )


def command_inputs(args: argparse.Namespace) -> list[Input]:
    """The files the command ``args`` describe reads, as far as its options tell."""
    from ..study import load_suite, suite_storage

    inputs = _storage_inputs(getattr(args, "storage", None), "the study database")
    suite_path = getattr(args, "suite", None)
    if suite_path:
        inputs.append(Input("the suite file", suite_path))
        suite = load_suite(suite_path)
        inputs += _storage_inputs(suite_storage(suite, getattr(args, "storage", None)), "the suite's study database")
        if suite.family.endswith(".toml"):
            inputs.append(Input("the suite's space file", suite.family))
    for option, what in (
        ("space", "the space file"),
        ("family", "the space file"),
        ("tuned", "the tuned configs"),
        ("config", "the config header"),
    ):
        value = getattr(args, option, None)
        if _file_option(value):
            inputs.append(Input(what, value))
    return inputs


def guard(args: argparse.Namespace, *outputs: str | Path) -> None:
    """Note the command's inputs and refuse (:class:`~tuner.files.OutputError`) an output that is one of them."""
    inputs = command_inputs(args)
    for item in inputs:
        note_input(item.what, item.path)
    guard_outputs([o for o in outputs if o], inputs)
