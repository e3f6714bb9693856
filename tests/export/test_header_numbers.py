"""read_header reads a knob's value as C reads it, or refuses it: ASCII decimal digits without a leading
zero, in one pair of parentheses or none. A value C would read otherwise (0100 is octal 64, 0128 no
number) or not at all (other scripts' digits, an unbalanced parenthesis) is one HeaderError."""

from __future__ import annotations

import pytest

from tests.export.test_header import KNOB, define_line, exported, parse, with_knob  # noqa: F401 (a fixture)
from tuner.export import HeaderError


def _spelled(value: int) -> list[str]:
    return [str(value), f"({value})", f"( {value} )"]


def test_plain_decimals_read_back(exported):  # noqa: F811
    text, config = exported
    for spelling in _spelled(config[KNOB.name]):
        assert parse(with_knob(text, f"#define {KNOB.macro} {spelling}")) == config, spelling


@pytest.mark.parametrize(
    "spelling",
    [
        "0{v}",  # octal to C
        "00{v}",
        "0x{v}",
        "{v}u",
        "+{v}",
        "- {v}",
        "({v}",
        "{v})",
        "(({v}))",
        "{arabic}",  # Arabic-Indic digits
        "{fullwidth}",
        "{v}.0",
        "1{v}e0",
    ],
)
def test_numbers_c_reads_otherwise_are_refused(exported, spelling):  # noqa: F811
    text, config = exported
    value = config[KNOB.name]
    digits = str(value)
    shown = spelling.format(
        v=digits,
        arabic="".join(chr(0x660 + int(d)) for d in digits),
        fullwidth="".join(chr(0xFF10 + int(d)) for d in digits),
    )
    with pytest.raises(HeaderError, match="not a decimal integer"):
        parse(with_knob(text, f"#define {KNOB.macro} {shown}"))


def test_a_leading_zero_is_refused_even_where_octal_would_be_a_valid_value(exported):  # noqa: F811
    text, _ = exported
    octal = next((v for v in KNOB.values if v >= 8 and all(c in "01234567" for c in str(v))), None)
    if octal is None:
        pytest.skip("no knob value spelled in octal digits")
    with pytest.raises(HeaderError, match="leading"):
        parse(with_knob(text, f"#define {KNOB.macro} 0{octal}"))


@pytest.mark.parametrize("condition", ["01", "0x1", "(1", "١"])
def test_if_conditions_are_read_as_c_reads_them_or_refused(exported, condition):  # noqa: F811
    text, _ = exported
    line = define_line(text)
    with pytest.raises(HeaderError, match="cannot evaluate"):
        parse(text.replace(line, f"#if {condition}\n{line}\n#endif"))
