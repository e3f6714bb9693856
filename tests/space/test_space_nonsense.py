"""Space files that TOML accepts but that mean nothing: refused at load with one line naming the entry."""

from __future__ import annotations

import time

import pytest

from tests.conftest import toy_space_text
from tuner.devices import KNOWN_ARCHS
from tuner.problem import Problem
from tuner.space import SpaceError, load_space

MESSAGE = "needs {smem_bytes} B of shared memory; the device allows {smem_per_block_optin} B"


def _load(tmp_path, text: str):
    path = tmp_path / "toy.toml"
    path.write_text(text)
    return load_space(path)


def _changed(old: str, new: str) -> str:
    text = toy_space_text()
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("arch", [1000, 0, 75, 81, 99, 121, -80])
def test_an_unknown_min_arch_is_refused(tmp_path, arch):
    with pytest.raises(SpaceError, match="min_arch"):
        _load(tmp_path, _changed("min_arch = 80", f"min_arch = {arch}"))


@pytest.mark.parametrize("arch", KNOWN_ARCHS)
def test_every_known_arch_loads(tmp_path, arch):
    assert _load(tmp_path, _changed("min_arch = 80", f"min_arch = {arch}")).family.min_arch == arch


@pytest.mark.parametrize("default", ["64.0", "6.4e1", "true", '"64"', "[64]"])
def test_a_knob_default_must_be_an_integer(tmp_path, default):
    text = _changed(
        'values = [32, 64, 128]\ndefault = 64\nhelp = "query rows per CTA"',
        f'values = [32, 64, 128]\ndefault = {default}\nhelp = "query rows per CTA"',
    )
    with pytest.raises(SpaceError, match="default"):
        _load(tmp_path, text)


@pytest.mark.parametrize(
    "table",
    [
        '{ "0128" = 32 }',
        '{ "128" = 32, "0128" = 64 }',
        '{ "128.0" = 32 }',
        '{ "+128" = 32 }',
        '{ "１２８" = 32 }',
        '{ "128" = 32.0 }',
        '{ "128" = true }',
    ],
)
def test_default_by_head_dim_keys_and_values_as_written_once(tmp_path, table):
    text = _changed(
        'default = 64\nhelp = "query rows per CTA"',
        f'default = 64\ndefault_by_head_dim = {table}\nhelp = "query rows per CTA"',
    )
    with pytest.raises(SpaceError, match="default_by_head_dim"):
        _load(tmp_path, text)


def test_default_by_head_dim_as_written_loads(tmp_path):
    text = _changed(
        'default = 64\nhelp = "query rows per CTA"',
        'default = 64\ndefault_by_head_dim = { 128 = 32 }\nhelp = "query rows per CTA"',
    )
    assert _load(tmp_path, text).defaults(128)["block_m"] == 32


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("head_dims = [64, 128]", "head_dims = [64, 128, 64]"),
        ('dtypes = ["fp16", "bf16"]', 'dtypes = ["fp16", "bf16", "fp16"]'),
    ],
)
def test_repeated_family_lists_are_refused(tmp_path, old, new):
    with pytest.raises(SpaceError, match="repeat"):
        _load(tmp_path, _changed(old, new))


@pytest.mark.parametrize(
    "field",
    [
        "{smem_bytes:1000000000}",
        "{smem_bytes:>1000000000}",
        "{smem_bytes.__class__.__mro__}",
        "{smem_bytes.real}",
        "{smem_bytes[0]}",
        "{smem_bytes!r}",
        "{smem_bytes!s:>9}",
        "{}",
        "{0}",
        "{nothing_declared}",
        "{smem_bytes:{smem_bytes}}",
    ],
)
def test_constraint_messages_hold_plain_fields_only(tmp_path, field):
    text = _changed(MESSAGE, f"needs {field} B")
    t0 = time.monotonic()
    with pytest.raises(SpaceError, match="not a valid format string") as info:
        _load(tmp_path, text)
    assert time.monotonic() - t0 < 5 and len(str(info.value)) < 2000


def test_a_plain_message_reads_as_before(tmp_path):
    space = _load(tmp_path, toy_space_text())
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=128)
    from tuner.devices import limits_for_arch

    reason = space.check({"block_m": 128, "block_n": 128, "stages": 3, "flag": 0}, problem, limits_for_arch(80))
    assert reason is not None and "B of shared memory; the device allows" in reason and "{" not in reason
