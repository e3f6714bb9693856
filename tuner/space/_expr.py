"""Small, safe integer expressions used by space files (derived values, constraints, launch).

An expression is parsed once with :func:`compile_expr`, which refuses anything that is not
arithmetic, comparison, boolean logic, a conditional or a call of a whitelisted function,
and reports the names it reads so that a space file can be checked before it is used.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import FlashtuneError

__all__ = ["MAX_DEPTH", "MAX_EXPONENT", "MAX_LENGTH", "MAX_VALUE", "Expr", "ExprError", "compile_expr"]

#: bounds that keep every expression cheap, whatever a space file says: an integer literal exponent of
#: at most MAX_EXPONENT, no value (constant or intermediate) beyond a signed 64-bit integer, bounded text
MAX_EXPONENT = 64
MAX_VALUE = 2**63 - 1
MAX_LENGTH = 2000
MAX_DEPTH = 40


class ExprError(FlashtuneError, ValueError):
    """An expression is malformed, uses something not allowed, or cannot be evaluated."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _log2(x: int) -> int:
    if x <= 0:
        raise ExprError(f"log2 of {x}")
    return int(math.log2(x))


FUNCTIONS: dict[str, Callable[..., int]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": _ceil_div,
    "log2": _log2,
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


@dataclass(frozen=True)
class Expr:
    """A parsed expression: its source text and the free names it reads."""

    text: str
    names: frozenset[str]
    _tree: ast.Expression

    def __call__(self, env: Mapping[str, int]) -> int:
        try:
            return _eval(self._tree.body, env)
        except ExprError as e:
            raise ExprError(f"{self.text!r}: {e}") from None
        except KeyError as e:
            raise ExprError(f"{self.text!r}: unknown name {e.args[0]!r}") from None
        except (ZeroDivisionError, OverflowError, TypeError) as e:
            raise ExprError(f"{self.text!r}: {e}") from None


def _depth(node: ast.AST, limit: int) -> int:
    """Nesting depth of ``node``, counted without recursion (a deep tree must not overflow the stack)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(current))
    return deepest


def compile_expr(text: str) -> Expr:
    """Parse ``text`` and check that it only uses allowed syntax and functions, within the bounds above."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected a non-empty expression string, got {text!r:.80}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"{text[:60]!r}...: expressions are limited to {MAX_LENGTH} characters")
    tree = _parse(text)
    names: set[str] = set()
    for node in ast.walk(tree):
        _check_node(node, text, names)
    return Expr(text=text.strip(), names=frozenset(names), _tree=tree)


def _parse(text: str) -> ast.Expression:
    """Parse ``text`` as an expression no deeper than ``MAX_DEPTH``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"{text!r}: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError(f"{text[:60]!r}...: too deeply nested") from None
    if _depth(tree, MAX_DEPTH) > MAX_DEPTH:
        raise ExprError(f"{text[:60]!r}: nested more than {MAX_DEPTH} levels deep")
    return tree


def _check_node(node: ast.AST, text: str, names: set[str]) -> None:
    """Refuse ``node`` unless it is allowed syntax within the bounds; add a variable it reads to ``names``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        exponent = node.right
        if not (
            isinstance(exponent, ast.Constant)
            and isinstance(exponent.value, int)
            and 0 <= exponent.value <= MAX_EXPONENT
        ):
            raise ExprError(
                f"{text!r}: the exponent of ** must be an integer literal from 0 to {MAX_EXPONENT} "
                "(write 2 ** 10, or shift with multiplication)"
            )
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExprError(f"{text!r}: only {sorted(FUNCTIONS)} may be called")
        if node.keywords:
            raise ExprError(f"{text!r}: keyword arguments are not allowed")
    elif isinstance(node, ast.Name):
        if node.id not in FUNCTIONS:
            names.add(node.id)
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, bool)):
            raise ExprError(f"{text!r}: only integer constants are allowed, got {node.value!r:.40}")
        if abs(node.value) > MAX_VALUE:
            raise ExprError(
                f"{text[:60]!r}: a constant of {int(node.value).bit_length()} bits exceeds a 64-bit integer"
            )
    elif not isinstance(
        node,
        (
            ast.Expression,
            ast.BinOp,
            ast.UnaryOp,
            ast.BoolOp,
            ast.Compare,
            ast.IfExp,
            ast.Load,
            ast.And,
            ast.Or,
            *_BINARY,
            *_COMPARE,
            *_UNARY,
        ),
    ):
        raise ExprError(f"{text!r}: {type(node).__name__} is not allowed")


def _bounded(value: int) -> int:
    if abs(value) > MAX_VALUE:
        raise ExprError(f"a value of {int(value).bit_length()} bits exceeds a 64-bit integer")
    return value


def _eval(node: ast.AST, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        return _bounded(env[node.id])
    if isinstance(node, ast.BinOp):
        return _bounded(_BINARY[type(node.op)](_eval(node.left, env), _eval(node.right, env)))
    if isinstance(node, ast.UnaryOp):
        return _bounded(_UNARY[type(node.op)](_eval(node.operand, env)))
    if isinstance(node, ast.BoolOp):  # Python semantics: short-circuit, and return the deciding operand
        stop_when = not isinstance(node.op, ast.And)  # `and` stops at a false operand, `or` at a true one
        for v in node.values:
            value = _eval(v, env)
            if bool(value) == stop_when:
                return value
        return value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call):
        return _bounded(FUNCTIONS[node.func.id](*(_eval(a, env) for a in node.args)))  # type: ignore[union-attr]
    raise ExprError(f"cannot evaluate {type(node).__name__}")
