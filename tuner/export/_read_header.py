"""Read the config back from a header written by ``flashtune export`` (``tuner.attention(config="best.h")``).

The header is read as the C preprocessor would see it, as far as a config header needs:
line splices and comments are removed, ``#if 0`` / ``#if 1`` / ``#ifdef`` / ``#ifndef`` /
``defined()`` / ``#elif`` / ``#else`` / ``#endif`` are followed, and only the ``#define``s of
active lines count. Anything a config header does not need (``#include``, other ``#if``
expressions, function-like ``FT_`` macros, C code) is refused with one line, rather than
guessed at. The header must name its family (``FLASHTUNE_FAMILY``), the problem it was made
for (``FT_HEAD_DIM``, ``FT_IS_BF16``, ``FT_IS_CAUSAL``) and every knob of the family's space;
with a ``problem`` the header must have been made for that problem's head dim, dtype and mask.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import FlashtuneError
from ..files import FileContentError, read_limited
from ..problem import Problem
from ..space import Config, ConfigError, Space

__all__ = [
    "MAX_HEADER_BYTES",
    "HeaderError",
    "active_defines",
    "decode_header",
    "header_family",
    "parse_header",
    "read_header",
]

MAX_HEADER_BYTES = 1 << 20  # an exported header is about 3 KB
_MAX_DIGITS = 18  # every value fits a 64-bit integer
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DIRECTIVE = re.compile(rf"#\s*({_IDENT})?\s*(.*)$", re.DOTALL)
_DEFINE = re.compile(rf"({_IDENT})(\()?\s*(.*)$", re.DOTALL)
# a decimal integer as C reads one and flashtune writes one: ASCII digits, no leading zero (C reads 0100 as
# octal 64 and refuses 0128), in one pair of parentheses or none
_DECIMAL = r"-?(?:0|[1-9][0-9]*)"
_INTEGER = re.compile(rf"\(\s*({_DECIMAL})\s*\)|({_DECIMAL})", re.ASCII)
_FAMILY_VALUE = re.compile(r'"([a-z][a-z0-9_]*)"')
_DEFINED = re.compile(rf"(!?)\s*defined\s*(?:\(\s*({_IDENT})\s*\)|\s+({_IDENT}))")
_PROBLEM_MACROS = ("FT_HEAD_DIM", "FT_IS_BF16", "FT_IS_CAUSAL")


class HeaderError(FlashtuneError, ValueError):
    """A config header cannot be read, is not one flashtune wrote, or does not fit the space or problem."""


# -- the preprocessor part -------------------------------------------------------------------------
def decode_header(data: bytes, where: str) -> str:
    """The text of a header file's bytes: UTF-8, no NUL bytes."""
    if b"\0" in data:
        raise HeaderError(f"{where} is a binary file, not a config header written by `flashtune export`")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(
            f"{where} is not UTF-8 text (byte {e.start}); a config header written by `flashtune export` is ASCII"
        ) from None


def _strip_comments(text: str, where: str) -> str:
    """``text`` after translation phases 2 and 3: line splices joined, each comment replaced by a space."""
    text = re.sub(r"\\\r?\n", "", text.replace("\r\n", "\n"))
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise HeaderError(f"{where}: a /* comment is never closed")
            out.append(" " + "\n" * text.count("\n", i, end))
            i = end + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if j >= n or text[j] != c:  # an apostrophe in prose (#error don't): an ordinary character
                out.append(c)
                i += 1
                continue
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _condition(expression: str, defines: Mapping[str, str], where: str) -> bool:
    """``#if`` / ``#elif`` conditions a config header may use: an integer, or ``[!]defined(NAME)``."""
    expression = expression.strip()
    if (m := _INTEGER.fullmatch(expression)) is not None and len((m.group(1) or m.group(2)).lstrip("-")) <= _MAX_DIGITS:
        return int(m.group(1) or m.group(2)) != 0
    if (m := _DEFINED.fullmatch(expression)) is not None:
        found = (m.group(2) or m.group(3)) in defines
        return not found if m.group(1) else found
    raise HeaderError(
        f"{where}: cannot evaluate `#if {expression[:80]}`; a config header may only use "
        "#if 0, #if 1, #ifdef, #ifndef and defined(NAME)"
    )


def active_defines(text: str, where: str) -> dict[str, str]:
    """Object-like macros defined by the active lines of ``text`` (name -> replacement text)."""
    defines: dict[str, str] = {}
    stack: list[list[bool]] = []  # per open #if: [enclosing group active, a branch taken, branch active, #else seen]
    for number, raw in enumerate(_strip_comments(text, where).split("\n"), 1):
        line = raw.strip()
        active = not stack or stack[-1][2]
        if not line.startswith("#"):
            if line and active:
                raise HeaderError(
                    f"{where} is not a config header written by `flashtune export`: line {number} is "
                    f"code ({line[:60]!r}), not a #define; a dispatch header is used through "
                    "config='auto', tuned=<the .json written beside it>"
                )
            continue
        m = _DIRECTIVE.match(line)
        name, rest = (m.group(1) or ""), m.group(2).strip()
        at = f"{where} line {number}"
        if name in ("if", "ifdef", "ifndef", "elif", "else", "endif"):
            _conditional(name, rest, active, stack, defines, at)
        elif active:  # other directives in a skipped group are not interpreted
            _directive(name, rest, defines, at)
    if stack:
        raise HeaderError(f"{where}: an #if/#ifdef/#ifndef is never closed by #endif")
    return defines


def _conditional(
    name: str, rest: str, active: bool, stack: list[list[bool]], defines: Mapping[str, str], at: str
) -> None:
    """Open, switch or close a conditional group on ``stack`` for an #if/#ifdef/#ifndef/#elif/#else/#endif."""
    if name in ("if", "ifdef", "ifndef"):
        if not active:
            taken = False  # a skipped group's conditions are not evaluated
        elif name == "if":
            taken = _condition(rest, defines, at)
        elif re.fullmatch(_IDENT, rest):
            taken = (rest in defines) == (name == "ifdef")
        else:
            raise HeaderError(f"{at}: #{name} needs one macro name, got {rest[:60]!r}")
        stack.append([active, taken, taken, False])
        return
    if not stack:
        raise HeaderError(f"{at}: #{name} without #if")
    outer, done, _, seen_else = stack[-1]
    if name == "endif":
        stack.pop()
    elif seen_else:
        raise HeaderError(f"{at}: #{name} after #else")
    elif name == "else":
        stack[-1] = [outer, True, outer and not done, True]
    else:
        now = outer and not done and _condition(rest, defines, at)
        stack[-1] = [outer, done or now, now, False]


def _directive(name: str, rest: str, defines: dict[str, str], at: str) -> None:
    """Apply an active directive other than a conditional one to ``defines``."""
    if name == "define":
        _define(rest, defines, at)
    elif name == "undef":
        if not re.fullmatch(_IDENT, rest):
            raise HeaderError(f"{at}: #undef needs one macro name, got {rest[:60]!r}")
        defines.pop(rest, None)
    elif name in ("pragma", "warning", ""):
        return
    elif name == "error":
        raise HeaderError(f"{at}: #error {rest[:100]}")
    else:
        raise HeaderError(
            f"{at}: #{name[:20]} is not something a config header written by `flashtune export` "
            "has; only #define, #undef and #if/#ifdef/#ifndef/#else/#endif are read"
        )


def _define(rest: str, defines: dict[str, str], at: str) -> None:
    m = _DEFINE.fullmatch(rest)
    if m is None:
        raise HeaderError(f"{at}: malformed #define {rest[:60]!r}")
    name, function_like, value = m.group(1), m.group(2), m.group(3).strip()
    if function_like:
        if name.startswith(("FT_", "FLASHTUNE_")):
            raise HeaderError(f"{at}: {name} is defined as a function-like macro; a config header defines values")
        return
    if name in defines and defines[name] != value:
        raise HeaderError(f"{at}: {name} is defined twice, as {defines[name][:40]!r} and {value[:40]!r}")
    defines[name] = value


# -- what the defines mean ---------------------------------------------------------------------------
def _integer(name: str, value: str, where: str) -> int:
    m = _INTEGER.fullmatch(value)
    if m is None:
        raise HeaderError(
            f"{where}: {name} is defined as {value[:40]!r}, not a decimal integer (ASCII digits, no leading "
            "zero: C reads 0100 as octal); export the header again"
        )
    number = m.group(1) or m.group(2)
    digits = number.lstrip("-")
    if len(digits) > _MAX_DIGITS:
        raise HeaderError(f"{where}: {name} = {value[:24]}... is too large ({len(digits)} digits)")
    return int(number)


def header_family(text: str, where: str) -> str:
    """The family a header names (``#define FLASHTUNE_FAMILY "sm90"``): what ``config=`` a header runs on."""
    return _family_of(active_defines(text, where), where)


def _family_of(defines: Mapping[str, str], where: str) -> str:
    family_text = defines.get("FLASHTUNE_FAMILY")
    if family_text is None:
        raise HeaderError(f"{where} defines no FLASHTUNE_FAMILY: not a config header written by `flashtune export`")
    m = _FAMILY_VALUE.fullmatch(family_text)
    if m is None:
        raise HeaderError(
            f"{where}: malformed family line, FLASHTUNE_FAMILY is {family_text[:40]!r}; expected a "
            'quoted family name such as "sm80"'
        )
    return m.group(1)


def parse_header(text: str, where: str, space: Space, problem: Problem | None = None) -> Config:
    """The knob values a header's active ``#define``s give, validated against ``space`` (and ``problem``)."""
    defines = active_defines(text, where)
    family = _family_of(defines, where)
    if family != space.name:
        raise HeaderError(
            f"{where} is a config of family {family!r}, not {space.name!r}; leave family= out (or pass "
            f"family={family!r}) to run it on the family it names"
        )
    knob_macros = {k.macro: k.name for k in space.knobs}
    derived_macros = {d.macro for d in space.derived if d.macro}
    values: dict[str, int] = {}
    for name, value in defines.items():
        if not name.startswith("FT_"):
            continue
        if name not in knob_macros and name not in derived_macros and name not in _PROBLEM_MACROS:
            raise HeaderError(
                f"{where} defines {name}, which the {space.name} space does not know: exported for "
                f"another version of search_spaces/{space.name}.toml? Export it again"
            )
        values[name] = _integer(name, value, where)
    missing = [m for m in (*_PROBLEM_MACROS, *knob_macros) if m not in values]
    if missing:
        raise HeaderError(
            f"{where} does not define {', '.join(missing)}: not a complete {space.name} config header "
            "written by `flashtune export`"
        )
    made_for = {"head_dim": values["FT_HEAD_DIM"], "is_bf16": values["FT_IS_BF16"], "causal": values["FT_IS_CAUSAL"]}
    if made_for["is_bf16"] not in (0, 1) or made_for["causal"] not in (0, 1) or made_for["head_dim"] <= 0:
        raise HeaderError(
            f"{where}: FT_HEAD_DIM {made_for['head_dim']}, FT_IS_BF16 {made_for['is_bf16']}, "
            f"FT_IS_CAUSAL {made_for['causal']} do not describe a problem"
        )
    if problem is not None:
        _check_problem(made_for, problem, where)
    try:
        return space.validate({knob_macros[m]: v for m, v in values.items() if m in knob_macros})
    except ConfigError as e:
        raise HeaderError(f"{where}: {e}") from None


def _describe(head_dim: int, is_bf16: int, causal: int) -> str:
    return f"head_dim {head_dim}, {'bf16' if is_bf16 else 'fp16'}, {'causal' if causal else 'non-causal'}"


def _check_problem(made_for: Mapping[str, int], problem: Problem, where: str) -> None:
    wanted = {"head_dim": problem.head_dim, "is_bf16": int(problem.dtype == "bf16"), "causal": int(problem.causal)}
    if dict(made_for) != wanted:
        raise HeaderError(
            f"{where} was exported for {_describe(**made_for)}, but this call is "
            f"{_describe(**wanted)}; export a header for this problem (or use config='auto')"
        )


def read_header(path: str | Path, space: Space, problem: Problem | None = None) -> Config:
    """The knob values of a header written by ``flashtune export``, validated against ``space`` (and ``problem``)."""
    where = str(path)
    try:
        _, data = read_limited(where, MAX_HEADER_BYTES, what="the config header")
    except FileContentError as e:
        raise HeaderError(f"cannot read config header {str(e).removeprefix('cannot read ')}") from None
    return parse_header(decode_header(data, where), where, space, problem)
