"""A small, safe expression language for ``when``, ``derived`` and ``forbidden.when``.

Expressions are parsed with :mod:`ast` and walked by :class:`Expr` itself: nothing is ever
passed to ``eval``/``exec``. Allowed: parameter names, constants (str, int, float, bool),
comparisons (``== != < <= > >=``, chained), ``and``/``or``/``not``, ``in``/``not in`` with
a tuple or list literal, ``+ - * // %`` and unary ``-``/``+`` on numbers, and calls of
``min``, ``max`` and ``abs``. Everything else (attributes, subscripts, other calls, lambdas,
comprehensions, f-strings, ``**``, ...) is refused when the file is loaded.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, cast

from autotune.errors import ConfigError

MAX_LENGTH = 1000
"""Longer expressions are refused (they would not be readable anyway)."""

FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
RESERVED_NAMES = frozenset({*FUNCTIONS, "True", "False", "None"})

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_REFUSED: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access (x.y)",
    ast.Subscript: "subscripts (x[i])",
    ast.Lambda: "lambda",
    ast.IfExp: "conditional expression (x if c else y)",
    ast.NamedExpr: "assignment (:=)",
    ast.JoinedStr: "f-string",
    ast.Dict: "dict literal",
    ast.Set: "set literal",
    ast.ListComp: "comprehension",
    ast.SetComp: "comprehension",
    ast.DictComp: "comprehension",
    ast.GeneratorExp: "comprehension",
    ast.Starred: "starred argument",
    ast.Await: "await",
    ast.Pow: "power operator (**)",
    ast.Div: "true division (/); use //",
    ast.BitAnd: "bitwise operator",
    ast.BitOr: "bitwise operator",
    ast.BitXor: "bitwise operator",
    ast.LShift: "bitwise operator",
    ast.RShift: "bitwise operator",
    ast.Invert: "bitwise operator",
    ast.MatMult: "matrix product (@)",
    ast.Is: "'is' comparison; use ==",
    ast.IsNot: "'is not' comparison; use !=",
}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Expr:
    """A compiled expression. :meth:`evaluate` raises :class:`ConfigError` naming the file
    and field on a runtime type error (``'a' < 1``) or a division by zero."""

    def __init__(self, source: str, tree: ast.Expression, *, file: str, field: str) -> None:
        self.source = source
        self.file = file
        self.field = field
        self._tree = tree
        called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        self.names: frozenset[str] = frozenset(
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and id(node) not in called
        )

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"

    def evaluate(self, values: Mapping[str, object]) -> object:
        """Value of the expression; every name it mentions must be in ``values``."""
        return self._eval(self._tree.body, values)

    def literal_comparisons(self) -> Iterator[tuple[str, list[object]]]:
        """``(name, constants)`` for every ``name == c``, ``name != c``, ``name in (c, ...)``;
        lets the loader check constants against a categorical's choices (typos)."""
        for node in ast.walk(self._tree):
            if not isinstance(node, ast.Compare) or len(node.ops) != 1:
                continue
            left, right = node.left, node.comparators[0]
            if isinstance(right, ast.Name) and isinstance(left, ast.Constant):
                left, right = right, left
            if not isinstance(left, ast.Name):
                continue
            if isinstance(node.ops[0], (ast.Eq, ast.NotEq)) and isinstance(right, ast.Constant):
                yield left.id, [cast(object, right.value)]
            elif isinstance(node.ops[0], (ast.In, ast.NotIn)) and isinstance(
                right, (ast.Tuple, ast.List)
            ):
                consts: list[object] = [e.value for e in right.elts if isinstance(e, ast.Constant)]
                if len(consts) == len(right.elts):
                    yield left.id, list(consts)

    # ------------------------------------------------------------------ evaluation

    def _fail(self, message: str) -> ConfigError:
        return ConfigError(
            f"{message} in expression {self.source!r}", file=self.file, field=self.field
        )

    def _eval(self, node: ast.expr, values: Mapping[str, object]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise self._fail(f"no value for '{node.id}'")
            return values[node.id]
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self._eval(e, values) for e in node.elts)
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            for operand in node.values:
                value = self._truth(operand, values, "and" if is_and else "or")
                if value is not is_and:
                    return value
            return is_and
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return not self._truth(node.operand, values, "not")
            operand = self._eval(node.operand, values)
            if not _is_number(operand):
                raise self._fail(f"unary minus/plus needs a number, got {operand!r}")
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            left = self._eval(node.left, values)
            right = self._eval(node.right, values)
            if not (_is_number(left) and _is_number(right)):
                raise self._fail(f"arithmetic needs numbers, got {left!r} and {right!r}")
            try:
                return _ARITH[type(node.op)](left, right)
            except (ZeroDivisionError, OverflowError) as exc:
                raise self._fail(f"{exc}") from None
        if isinstance(node, ast.Compare):
            return self._compare(node, values)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            args = [self._eval(a, values) for a in node.args]
            try:
                return FUNCTIONS[node.func.id](*args)
            except (TypeError, ValueError) as exc:
                raise self._fail(f"{node.func.id}(): {exc}") from None
        raise self._fail(f"unsupported syntax {type(node).__name__}")  # checked at compile

    def _truth(self, node: ast.expr, values: Mapping[str, object], op: str) -> bool:
        value = self._eval(node, values)
        if not isinstance(value, bool):
            raise self._fail(f"'{op}' needs true/false operands, got {value!r}")
        return value

    def _compare(self, node: ast.Compare, values: Mapping[str, object]) -> bool:
        left = self._eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators, strict=False):
            right = self._eval(right_node, values)
            if isinstance(op, (ast.In, ast.NotIn)):
                found = any(same_value(left, item) for item in right)
                result = found if isinstance(op, ast.In) else not found
            elif isinstance(op, (ast.Eq, ast.NotEq)):
                result = same_value(left, right) == isinstance(op, ast.Eq)
            else:
                try:
                    result = bool(_COMPARE[type(op)](left, right))
                except TypeError:
                    raise self._fail(f"cannot order {left!r} and {right!r}") from None
            if not result:
                return False
            left = right
        return True


def same_value(a: object, b: object) -> bool:
    """Equality without Python's ``True == 1``: booleans only equal booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _check(node: ast.AST, source: str, fail: Callable[[str], ConfigError]) -> None:
    """Refuse every node outside the whitelist, with a message naming what was refused."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            func = child.func
            if (
                not isinstance(func, ast.Name)
                or func.id not in FUNCTIONS
                or child.keywords
                or any(isinstance(a, ast.Starred) for a in child.args)
                or not child.args
                or (func.id == "abs" and len(child.args) != 1)
            ):
                raise fail(
                    "function calls other than min(a, b, ...), max(a, b, ...) and abs(x) are "
                    "not allowed"
                )
            continue
        if isinstance(child, ast.Name) and child.id.startswith("__"):
            raise fail(f"dunder names ('{child.id}') are not allowed")
        for kind, what in _REFUSED.items():
            if isinstance(child, kind):
                raise fail(f"{what} is not allowed")
        allowed = (
            ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Tuple, ast.List,
            ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.BinOp, ast.Compare, *_ARITH, *_COMPARE, ast.In, ast.NotIn,
        )  # fmt: skip
        if not isinstance(child, allowed):
            raise fail(f"'{type(child).__name__}' is not allowed")
        if isinstance(child, ast.Constant) and (
            child.value is None
            or child.value is Ellipsis
            or not isinstance(child.value, (bool, int, float, str))
        ):
            raise fail(
                f"constant {child.value!r} is not allowed (use strings, numbers, true/false)"
            )
        if isinstance(child, ast.Compare):
            for op, right in zip(child.ops, child.comparators, strict=False):
                if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(
                    right, (ast.Tuple, ast.List)
                ):
                    raise fail("'in' / 'not in' need a tuple or list literal on the right")


def compile_expression(
    source: object,
    *,
    names: Collection[str],
    file: str,
    field: str,
) -> Expr:
    """Parse and check ``source``; every name must be in ``names`` (the parameters).

    Raises :class:`ConfigError` naming ``file`` and ``field`` for anything that is not in the
    whitelist and for unknown names (listing ``names``).
    """

    def fail(message: str, allowed: Collection[str] | None = None) -> ConfigError:
        return ConfigError(
            f"{message} (expression {str(source)!r})",
            file=file,
            field=field,
            allowed=sorted(allowed) if allowed is not None else None,
        )

    if not isinstance(source, str) or not source.strip():
        raise fail("expected a non-empty expression string")
    if len(source) > MAX_LENGTH:
        raise fail(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise fail(f"syntax error: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise fail("cannot parse (too deeply nested or contains NUL bytes)") from None
    _check(tree, source, fail)
    expr = Expr(source.strip(), tree, file=file, field=field)
    unknown = sorted(expr.names - set(names))
    if unknown:
        raise fail(f"unknown name '{unknown[0]}'; use a parameter name", allowed=names)
    return expr


def _literal(value: object) -> str:
    return repr(value)


def condition_source(mapping: Mapping[str, object]) -> str:
    """The expression equivalent to a mapping condition ``{a: x, b: [y, z]}``."""
    parts = []
    for name, wanted in mapping.items():
        if isinstance(wanted, list):
            parts.append(f"{name} in ({', '.join(map(_literal, wanted))},)")
        else:
            parts.append(f"{name} == {_literal(wanted)}")
    return " and ".join(parts)
