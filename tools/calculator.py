"""``calculator``: safe arithmetic for agents.

Models are bad at arithmetic, and ``eval`` on model output would run whatever
the model (or a prompt injection) wrote. So the expression is parsed with
:mod:`ast` and only a whitelist is evaluated: numbers, ``+ - * / // % **``,
unary ``+``/``-``, parentheses, the constants ``pi`` and ``e`` and a few
functions. Everything else (names, attributes, other calls, strings,
comparisons, ...) is refused with an error that names it.

Python's ints are unbounded, so ``9**9**9`` would run (and allocate) for a
very long time: powers, products and shifts in size are checked *before* they
are computed, the expression length and nesting depth are capped, and float
overflow is an error rather than ``inf``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from wakeful.agent_tools import AgentTool, ToolResult
from wakeful.cancellation import CancelSignal

__all__ = ["Calculation", "CalculationError", "calculator", "evaluate", "format_number"]

MAX_LENGTH = 500  # characters of an expression
MAX_DEPTH = 100  # nesting of sub-expressions (a chain like 1+2+3+... counts once)
MAX_INT_BITS = 4096  # about 1233 decimal digits; larger integer results are refused
MAX_ROUND_DIGITS = 100

Number = int | float


class CalculationError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


class Calculation(msgspec.Struct):
    expression: Annotated[
        str,
        msgspec.Meta(
            description="An arithmetic expression, e.g. '(3 + 4) * 2 ** 10 / sqrt(2)'. "
            "Operators: + - * / // % **. Functions: sqrt, abs, round, min, max, log, "
            "sin, cos. Constants: pi, e."
        ),
    ]


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS:
        raise CalculationError(
            f"round() digits must be a whole number between -{MAX_ROUND_DIGITS} and "
            f"{MAX_ROUND_DIGITS}, got {format_number(ndigits)}"
        )
    return round(x, ndigits)


# name -> (function, min args, max args)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *xs: min(xs), 1, 50),
    "max": (lambda *xs: max(xs), 1, 50),
    "log": (_log, 1, 2),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_BINARY: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}

# What a refused node is, in words (anything else is named by its AST class).
_REFUSED: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Subscript: "indexing",
    ast.Compare: "a comparison",
    ast.BoolOp: "'and'/'or'",
    ast.UnaryOp: "'not'/'~'",  # the allowed unary operators are handled before
    ast.IfExp: "a conditional expression",
    ast.Lambda: "lambda",
    ast.List: "a list",
    ast.Tuple: "a tuple",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.ListComp: "a comprehension",
    ast.GeneratorExp: "a comprehension",
    ast.JoinedStr: "a string",
    ast.NamedExpr: "assignment",
    ast.Starred: "unpacking",
}


def evaluate(expression: str) -> Number:
    """The value of ``expression``; raises :class:`CalculationError` saying what is wrong."""
    text = expression.strip()
    if not text:
        raise CalculationError("the expression is empty")
    if len(text) > MAX_LENGTH:
        raise CalculationError(
            f"the expression is {len(text)} characters long; the limit is {MAX_LENGTH}"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"invalid syntax: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculationError("the expression is too deeply nested") from None
    try:
        return _check(_eval(tree.body, 0))
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except OverflowError:
        raise CalculationError("the result is too large") from None
    except RecursionError:
        raise CalculationError("the expression is too deeply nested") from None


def _eval(node: ast.expr, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculationError(f"the expression is nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "strings" if isinstance(value, str) else f"{type(value).__name__} values"
            raise CalculationError(f"{kind} are not allowed ({value!r}); only numbers are")
        return value
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise CalculationError(
            f"name {node.id!r} is not allowed (constants: {', '.join(CONSTANTS)})"
        )
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth + 1))
    if isinstance(node, ast.BinOp):
        return _eval_chain(node, depth)
    if isinstance(node, ast.Call):
        return _call(node, depth)
    what = _REFUSED.get(type(node)) or type(node).__name__
    raise CalculationError(f"{what} is not allowed")


def _eval_chain(node: ast.BinOp, depth: int) -> Number:
    """A left-leaning chain (``1 + 2 - 3 + ...``) iteratively, so a long sum is not "deep"."""
    chain: list[ast.BinOp] = []
    left: ast.expr = node
    while isinstance(left, ast.BinOp):
        chain.append(left)
        left = left.left
    value = _eval(left, depth + 1)
    for step in reversed(chain):
        if type(step.op) not in _BINARY:
            raise CalculationError(f"operator {type(step.op).__name__} is not allowed")
        symbol, apply = _BINARY[type(step.op)]
        right = _eval(step.right, depth + 1)
        _guard(symbol, value, right)
        value = _check(apply(value, right))
    return value


def _guard(symbol: str, a: Number, b: Number) -> None:
    """Refuse integer operations whose result would be huge, before computing them.

    Float operations need no guard: they overflow (an error) instead of growing.
    """
    if not (isinstance(a, int) and isinstance(b, int)):
        return
    if symbol == "**" and b > 0 and abs(a) > 1 and (abs(a).bit_length() - 1) * b > MAX_INT_BITS:
        raise CalculationError(
            f"{format_number(a)} ** {format_number(b)} is too large "
            f"(results are limited to {MAX_INT_BITS} bits)"
        )
    if symbol == "*" and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
        raise CalculationError(
            f"the product is too large (results are limited to {MAX_INT_BITS} bits)"
        )


def _call(node: ast.Call, depth: int) -> Number:
    if not isinstance(node.func, ast.Name):
        raise CalculationError(
            f"only calls of {', '.join(FUNCTIONS)} are allowed, "
            "by name (attribute access is not allowed)"
        )
    name = node.func.id
    if name not in FUNCTIONS:
        raise CalculationError(
            f"function {name!r} is not allowed (functions: {', '.join(FUNCTIONS)})"
        )
    if node.keywords:
        raise CalculationError(f"{name}() takes no keyword arguments")
    function, least, most = FUNCTIONS[name]
    if not least <= len(node.args) <= most:
        expected = str(least) if least == most else f"{least} to {most}"
        plural = "" if most == 1 else "s"
        raise CalculationError(f"{name}() takes {expected} argument{plural}, got {len(node.args)}")
    args = [_eval(arg, depth + 1) for arg in node.args]
    try:
        return _check(function(*args))
    except CalculationError:
        raise
    except (ValueError, TypeError) as exc:  # math domain errors: sqrt(-1), log(0)
        shown = ", ".join(format_number(a) for a in args)
        raise CalculationError(f"{name}({shown}) is undefined ({exc})") from None


def _check(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculationError("the result is a complex number; only real numbers are supported")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculationError(
            f"the result is too large (results are limited to {MAX_INT_BITS} bits)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError(
            "the result is too large" if math.isinf(value) else "the result is not a number"
        )
    return value


def format_number(value: Number) -> str:
    """Whole floats without ``.0`` (``8 / 2`` shows ``4``), others as Python prints them."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


async def _execute(
    call_id: str, p: Calculation, signal: CancelSignal, on_update: Any
) -> ToolResult:
    try:
        value = evaluate(p.expression)
    except CalculationError as exc:
        return ToolResult(f"Cannot evaluate {p.expression!r}: {exc}", is_error=True)
    shown = format_number(value)
    return ToolResult(
        f"{p.expression.strip()} = {shown}", details={"expression": p.expression, "value": value}
    )


calculator = AgentTool(
    "calculator",
    "Evaluate an arithmetic expression exactly and safely. Use it for any arithmetic "
    "instead of working it out yourself.",
    Calculation,
    _execute,
    label="Calculator",
)
