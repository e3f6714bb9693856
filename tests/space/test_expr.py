"""tuner.expr: the safe integer expressions of space files."""

from __future__ import annotations

import pytest

from tuner.space import ExprError, compile_expr


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("1 + 2 * 3", {}, 7),
        ("(1 + 2) * 3", {}, 9),
        ("7 // 2 + 7 % 2", {}, 4),
        ("-7 // 2", {}, -4),
        ("2 ** 10", {}, 1024),
        ("a - b", {"a": 3, "b": 5}, -2),
        ("+a", {"a": 3}, 3),
        ("1 < 2 < 3", {}, True),
        ("1 < 3 < 2", {}, False),
        ("a == b != c", {"a": 1, "b": 1, "c": 2}, True),
        ("a == b != c", {"a": 1, "b": 1, "c": 1}, False),
        ("a >= 2 and b <= 3", {"a": 2, "b": 3}, True),
        ("a > 2 or b < 3", {"a": 2, "b": 3}, False),
        ("not a", {"a": 0}, True),
        ("not a", {"a": 5}, False),
        ("x if c else y", {"x": 1, "y": 2, "c": 1}, 1),
        ("x if c else y", {"x": 1, "y": 2, "c": 0}, 2),
        ("min(a, b, 7)", {"a": 9, "b": 8}, 7),
        ("max(a, b)", {"a": 9, "b": 8}, 9),
        ("abs(a - b)", {"a": 3, "b": 8}, 5),
        ("ceil_div(7, 2)", {}, 4),
        ("ceil_div(8, 2)", {}, 4),
        ("ceil_div(1, 128)", {}, 1),
        ("log2(1024)", {}, 10),
        ("log2(1000)", {}, 9),
        ("log2(1)", {}, 0),
        ("True + 1", {}, 2),
        ("block_n // 2 + (block_n // 4 if overlap else 0)", {"block_n": 128, "overlap": 1}, 96),
    ],
)
def test_allowed_syntax_evaluates_like_python(text, env, expected):
    assert compile_expr(text)(env) == expected


def test_and_or_short_circuit():
    # the right operand would divide by zero: it must not be evaluated
    assert not compile_expr("a != 0 and 10 // a > 1")({"a": 0})
    assert compile_expr("a == 0 or 10 // a > 1")({"a": 0})


def test_and_or_return_an_operand_like_python():
    assert compile_expr("a or 64")({"a": 0}) == 64
    assert compile_expr("a or 64")({"a": 32}) == 32
    assert compile_expr("a and 64")({"a": 0}) == 0
    assert compile_expr("a and 64")({"a": 1}) == 64


@pytest.mark.parametrize(
    "text",
    [
        "a.b",
        "a.bit_length()",
        "pow(2, 3)",
        "__import__('os')",
        "print(1)",
        "eval('1')",
        "'abc'",
        "a + 'x'",
        "1.5",
        "a * 0.5",
        "None",
        "lambda: 1",
        "(lambda x: x)(1)",
        "a[0]",
        "[1, 2]",
        "(1, 2)",
        "{1: 2}",
        "[x for x in a]",
        "(x := 1)",
        "min(*a)",
        "max(a, key=b)",
        "a if",
        "",
        "   ",
        "1 +",
        "a; b",
    ],
)
def test_disallowed_syntax_is_refused(text):
    with pytest.raises(ExprError):
        compile_expr(text)


def test_non_string_is_refused():
    with pytest.raises(ExprError):
        compile_expr(42)  # type: ignore[arg-type]


def test_refusal_message_names_the_expression():
    with pytest.raises(ExprError, match="pow"):
        compile_expr("pow(2, 3)")


def test_names_are_reported_without_functions():
    e = compile_expr("a + b * min(c, 2) if ceil_div(d, 4) else log2(a)")
    assert e.names == frozenset({"a", "b", "c", "d"})
    assert compile_expr("1 + 2").names == frozenset()


def test_text_is_stripped():
    assert compile_expr("  a + 1 ").text == "a + 1"


@pytest.mark.parametrize(
    ("text", "env", "match"),
    [
        ("a + 1", {}, "unknown name 'a'"),
        ("1 // a", {"a": 0}, "division"),
        ("a % 0", {"a": 1}, "modulo"),
        ("log2(a)", {"a": 0}, "log2"),
        ("min()", {}, "min"),
    ],
)
def test_evaluation_errors_are_expr_errors(text, env, match):
    with pytest.raises(ExprError, match=match):
        compile_expr(text)(env)


def test_expr_is_reusable_with_different_environments():
    e = compile_expr("ceil_div(seqlen_q, block_m)")
    assert [e({"seqlen_q": n, "block_m": 128}) for n in (1, 128, 129, 4096)] == [1, 1, 2, 32]


# -- bounds (issue 11, item 4): no expression can hang a check or a tuner ------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "a ** a ** a",
        "2 ** a",
        "a ** 65",
        "a ** -1",
        "a ** (1 + 1)",
        "9" * 2001,
        "-" * 60 + "a",
        "99999999999999999999 + a",
    ],
)
def test_unbounded_expressions_are_refused_when_compiled(text):
    with pytest.raises(ExprError):
        compile_expr(text)


@pytest.mark.parametrize(
    ("text", "env"), [("a * a * a", {"a": 2**40}), ("a ** 64", {"a": 3}), ("ceil_div(a * a, 1) * a", {"a": 2**32})]
)
def test_values_beyond_64_bits_are_an_error_not_a_slow_big_number(text, env):
    with pytest.raises(ExprError, match="64-bit"):
        compile_expr(text)(env)


def test_bounded_powers_still_work():
    assert compile_expr("2 ** 62 + (2 ** 62 - 1)")({}) == 2**63 - 1
    assert compile_expr("a ** 2")({"a": 3}) == 9
