"""Reading a config header back (``tuner.export.read_header``): careless and hostile headers.

The base is a header ``flashtune export`` wrote for a fake study; each case changes it the way
a person or a tool might, and must give the config the C preprocessor would see, or one line.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime

import pytest

from tests.fake_studies import family_for_tests, make_study
from tuner.errors import FlashtuneError
from tuner.export import HeaderError, parse_header, read_header, render_header
from tuner.problem import Problem
from tuner.space import available_families, load_space
from tuner.study import StudyError, choose

PROBLEM = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, dtype="bf16", causal=True)
SPACE = load_space(family_for_tests())
KNOB = SPACE.knobs[0]  # the first knob, its macro, and a value other than the study's
NOW = datetime(2025, 3, 4, tzinfo=UTC)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(header text, the config it holds)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('header')}/s.db"
    chosen = choose(make_study(url, "header", SPACE.name, PROBLEM, n_trials=12, failures=False))
    return render_header(chosen, storage_url=url, now=NOW), chosen.config


def other_value(config) -> int:
    return next(v for v in KNOB.values if v != config[KNOB.name])


def define_line(text: str) -> str:
    return next(line for line in text.splitlines() if re.match(rf"#define {KNOB.macro}\s", line))


def with_knob(text: str, replacement: str) -> str:
    """``text`` with the first knob's #define line replaced by ``replacement`` (several lines allowed)."""
    return text.replace(define_line(text), replacement)


def parse(text: str, problem: Problem | None = None):
    return parse_header(text, "best.h", SPACE, problem)


def test_the_exported_header_reads_back(exported):
    text, config = exported
    assert parse(text) == config == parse(text, PROBLEM)


def test_defines_in_comments_and_disabled_groups_do_not_count(exported):
    text, config = exported
    value, line = other_value(config), define_line(text)
    decoys = [
        f"// #define {KNOB.macro} {value}\n{line}",
        f"/* #define {KNOB.macro} {value} */\n{line}",
        f"/*\n#define {KNOB.macro} {value}\n*/\n{line}",
        f"#if 0\n#define {KNOB.macro} {value}\n#endif\n{line}",
        f"#if 0\n#define {KNOB.macro} {value}\n#else\n{line}\n#endif",
        f"#ifdef FLASHTUNE_NOT_DEFINED\n#define {KNOB.macro} {value}\n#elif 1\n{line}\n#endif",
        f"#if 1\n#if 0\n#define {KNOB.macro} {value}\n#endif\n{line}\n#endif",
        f"#if 0\n#if garbage that is never evaluated\n#define {KNOB.macro} {value}\n#endif\n#endif\n{line}",
        f"#define {KNOB.macro} {value}\n#undef {KNOB.macro}\n{line}",
        f'#define NOTE "// not a comment, and #define {KNOB.macro} {value} is in a string"\n{line}',
    ]
    for decoy in decoys:
        assert parse(with_knob(text, decoy)) == config, decoy


def test_active_defines_count_however_they_are_written(exported):
    text, config = exported
    value = other_value(config)
    for written in (
        f"#define {KNOB.macro} \\\n  {value}",
        f"  #  define {KNOB.macro} ({value})  // note",
        f"#define {KNOB.macro} {value} /* note */",
        f"#if 1\n#define {KNOB.macro} {value}\n#endif",
        f"#ifndef {KNOB.macro}\n#define {KNOB.macro} {value}\n#endif",
    ):
        assert parse(with_knob(text, written))[KNOB.name] == value, written


def test_a_header_for_another_problem_is_refused_when_the_problem_is_known(exported, tmp_path):
    text, config = exported
    path = tmp_path / "best.h"
    path.write_text(text)
    for other in (
        Problem(**{**PROBLEM.to_dict(), "head_dim": 64}),
        Problem(**{**PROBLEM.to_dict(), "causal": False}),
        Problem(**{**PROBLEM.to_dict(), "dtype": "fp16"}),
    ):
        with pytest.raises(StudyError, match="was exported for head_dim 128, bf16, causal, but this call is"):
            read_header(path, SPACE, other)
    same_kind = Problem(**{**PROBLEM.to_dict(), "batch": 1, "seqlen_q": 77, "heads_q": 2, "heads_kv": 1})
    assert read_header(path, SPACE, same_kind) == config  # the shape itself may differ


@pytest.mark.parametrize(
    "family_line, message",
    [
        (f"#define FLASHTUNE_FAMILY {SPACE.name}", "malformed family line"),
        (f'#define FLASHTUNE_FAMILY "{SPACE.name}" extra', "malformed family line"),
        (f"#define FLASHTUNE_FAMILY '{SPACE.name}'", "malformed family line"),
        (f'#define FLASHTUNE_FAMILY "{SPACE.name.upper()}"', "malformed family line"),
        (f'// #define FLASHTUNE_FAMILY "{SPACE.name}"', "defines no FLASHTUNE_FAMILY"),
        ("", "defines no FLASHTUNE_FAMILY"),
    ],
)
def test_the_family_line_is_always_checked(exported, family_line, message):
    text, _ = exported
    with pytest.raises(HeaderError, match=message):
        parse(text.replace(f'#define FLASHTUNE_FAMILY "{SPACE.name}"', family_line))


@pytest.mark.skipif(len(available_families()) < 2, reason="needs a second family")
def test_another_familys_header_is_refused(exported):
    text, _ = exported
    other = load_space(next(f for f in available_families() if f != SPACE.name))
    with pytest.raises(HeaderError, match=f"is a config of family '{SPACE.name}', not '{other.name}'"):
        parse_header(text, "best.h", other)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t, v: with_knob(t, f"#define {KNOB.macro} 0x40"), "not a decimal integer"),
        (lambda t, v: with_knob(t, f"#define {KNOB.macro} {'9' * 5000}"), "too large"),
        (lambda t, v: with_knob(t, f"#define {KNOB.macro} -{'9' * 19}"), "too large"),
        (lambda t, v: with_knob(t, f"#define {KNOB.macro} 12345"), "not one of"),
        (lambda t, v: with_knob(t, f"#define {KNOB.macro}(x) {v}"), "function-like"),
        (lambda t, v: with_knob(t, ""), f"does not define {KNOB.macro}"),
        (lambda t, v: t + f"#define {KNOB.macro} {v}\n", f"{KNOB.macro} is defined twice"),
        (lambda t, v: t + "#define FT_NOT_A_KNOB 1\n", "defines FT_NOT_A_KNOB, which the"),
        (lambda t, v: t.replace("#define FT_HEAD_DIM 128", "#define FT_HEAD_DIM 0"), "do not describe a problem"),
        (lambda t, v: t.replace("#define FT_IS_CAUSAL 1", "#define FT_IS_CAUSAL 2"), "do not describe a problem"),
        (lambda t, v: t.replace("#define FT_IS_CAUSAL 1", ""), "does not define FT_IS_CAUSAL"),
        (lambda t, v: t + '#include "other.h"\n', "#include is not something"),
        (lambda t, v: t + "#if FT_HEAD_DIM > 64\n#endif\n", "cannot evaluate"),
        (lambda t, v: t + "#error made by hand\n", "#error made by hand"),
        (lambda t, v: t + "#if 1\n", "never closed by #endif"),
        (lambda t, v: t + "#endif\n", "#endif without #if"),
        (lambda t, v: t + "#if 1\n#else\n#else\n#endif\n", "#else after #else"),
        (lambda t, v: t + "/* an open comment\n", "never closed"),
        (lambda t, v: t + "int x = 1;\n", "line .* is code"),
        (lambda t, v: t + "#ifdef\n#endif\n", "needs one macro name"),
    ],
)
def test_careless_headers_get_one_line(exported, change, message):
    text, config = exported
    with pytest.raises(HeaderError, match=message) as e:
        parse(change(text, other_value(config)))
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_a_dispatch_header_is_pointed_to_config_auto(exported):
    text = (
        "// flashtune dispatch header\n#ifndef FLASHTUNE_DISPATCH_H\n#define FLASHTUNE_DISPATCH_H\n"
        "namespace flashtune {\n}\n#endif\n"
    )
    with pytest.raises(HeaderError, match="config='auto', tuned="):
        parse(text)


def test_unreadable_files_are_flashtune_errors(exported, tmp_path):
    text, _ = exported
    cases = {
        "binary.h": os.urandom(4096) + b"\0",
        "latin1.h": text.replace("//", "// caf\xe9", 1).encode("latin-1"),
        "huge.h": text.encode() + b"//" + b"x" * (1 << 20),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder.h").mkdir()
    os.mkfifo(tmp_path / "fifo.h")  # must not block
    for name, message in (
        ("binary.h", "binary file"),
        ("latin1.h", "not UTF-8"),
        ("huge.h", "bytes"),
        ("folder.h", "cannot read"),
        ("fifo.h", "not a regular file"),
        ("absent.h", "cannot read"),
    ):
        with pytest.raises(StudyError, match=message) as e:
            read_header(tmp_path / name, SPACE)
        assert isinstance(e.value, FlashtuneError) and "\n" not in str(e.value)
    with pytest.raises(StudyError, match="not a regular file"):
        read_header("/dev/zero", SPACE)
