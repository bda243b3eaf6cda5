"""Interval arithmetic and constraint propagation over a join filter (the SHJ pruning paper).

A join filter is a small expression graph (DAEG) over columns of the two join
sides: leaves are columns (``Col('build', 'ts')``) and constants, inner nodes
``+``, ``-``, comparisons (``>``, ``>=``, ``<``, ``<=``) and ``AND``. Columns are
integers (ts in ms, arrival counts), so a strict comparison ``a > b`` is the
closed ``a - b >= 1`` and every interval here is closed, ``[lo, hi]``, with
``-inf``/``inf`` for unbounded ends.

Two passes, as in DataFusion's ``ExprIntervalGraph``:

- *bottom-up* (post-order): each node's interval from its children's, by the
  interval operators ``[a, b] + [c, d] = [a + c, b + d]`` and
  ``[a, b] - [c, d] = [a - d, b - c]``;
- *top-down*: the root (the conjunction) must be true, so each comparison
  must hold, which narrows its operands; then ``z = x + y`` narrows
  ``x`` to ``X ∩ (Z - Y)`` and ``y`` to ``Y ∩ (Z - X)``, and ``z = x - y``
  narrows ``x`` to ``X ∩ (Z + Y)`` and ``y`` to ``Y ∩ (X - Z)``, down to the
  columns. Columns shared by several comparisons are one leaf each (a DAG), so
  the two passes repeat until nothing narrows.

Worked example (the paper's): ``a >= b - 3`` with ``a`` in [1, inf] (the oldest
buffered value on the build side) and ``b`` in [6, inf] (the newest value on
the probe side): bottom-up ``b - 3`` is [3, inf]; top-down ``a`` narrows to
``[1, inf] ∩ [3, inf] = [3, inf]``: buffered rows with ``a < 3`` can never match
a future row and are pruned::

    >>> a, b = Col("build", "a"), Col("probe", "b")
    >>> f = And(Cmp(">=", a, Sub(b, Const(3))))
    >>> propagate(f, {a: Interval(1, INF), b: Interval(6, INF)})[a]
    Interval(lo=3, hi=inf)

``linear_form`` lowers the same filter to rows ``sum(coef * column) + c >= 0``,
which the Numba probe kernels evaluate exactly per candidate pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Interval:
    """A closed interval of integers; ``lo > hi`` is empty. Ends may be -inf/inf."""

    lo: float
    hi: float

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def __add__(self, o: Interval) -> Interval:
        return Interval(_add(self.lo, o.lo), _add(self.hi, o.hi))

    def __sub__(self, o: Interval) -> Interval:
        return Interval(_add(self.lo, -o.hi), _add(self.hi, -o.lo))

    def __and__(self, o: Interval) -> Interval:
        """Intersection."""
        return Interval(max(self.lo, o.lo), min(self.hi, o.hi))


UNBOUNDED = Interval(-INF, INF)


def _add(x, y):
    # inf + -inf only arises from empty operands; keep it empty-ish rather than NaN
    if math.isinf(x) and math.isinf(y) and x != y:
        return 0
    return x + y


# --------------------------------------------------------------------------- expression nodes


class Expr:
    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True, eq=True)
class Col(Expr):
    """A column of one join side: ``side`` is 'build' (buffered rows) or 'probe' (future rows)."""

    side: str
    name: str


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: int


@dataclass(frozen=True, eq=False)
class Add(Expr):
    left: Expr
    right: Expr

    def children(self):
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Sub(Expr):
    left: Expr
    right: Expr

    def children(self):
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Cmp(Expr):
    """``left OP right`` with OP one of ``>``, ``>=``, ``<``, ``<=`` (integers)."""

    op: str
    left: Expr
    right: Expr

    def __post_init__(self):
        if self.op not in (">", ">=", "<", "<="):
            raise ValueError(f"comparison {self.op!r}: use one of > >= < <=")

    def children(self):
        return (self.left, self.right)

    def diff_bound(self) -> tuple[Expr, Expr, Interval]:
        """As ``x - y`` in an interval: ``a > b`` -> (a, b, [1, inf]),
        ``a <= b`` -> (b, a, [0, inf])."""
        if self.op in (">", ">="):
            return self.left, self.right, Interval(1 if self.op == ">" else 0, INF)
        return self.right, self.left, Interval(1 if self.op == "<" else 0, INF)


@dataclass(frozen=True, eq=False)
class And(Expr):
    terms: tuple[Cmp, ...]

    def __init__(self, *terms: Cmp):
        object.__setattr__(self, "terms", tuple(terms))

    def children(self):
        return self.terms


def columns(e: Expr) -> list[Col]:
    """The distinct columns of an expression, in first-seen order."""
    out: list[Col] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Col):
            if x not in out:
                out.append(x)
        stack.extend(reversed(x.children()))
    return out


# --------------------------------------------------------------------------- the two passes


def evaluate(e: Expr, bounds: dict[Col, Interval], memo: dict | None = None) -> Interval:
    """Bottom-up: the interval of an arithmetic node (columns missing from ``bounds``
    are unbounded). For a comparison, [0, 0] = surely false, [1, 1] = surely true,
    [0, 1] = unknown; AND combines those."""
    memo = {} if memo is None else memo
    k = id(e)
    if k in memo:
        return memo[k]
    if isinstance(e, Col):
        v = bounds.get(e, UNBOUNDED)
    elif isinstance(e, Const):
        v = Interval(e.value, e.value)
    elif isinstance(e, Add):
        v = evaluate(e.left, bounds, memo) + evaluate(e.right, bounds, memo)
    elif isinstance(e, Sub):
        v = evaluate(e.left, bounds, memo) - evaluate(e.right, bounds, memo)
    elif isinstance(e, Cmp):
        x, y, need = e.diff_bound()
        d = evaluate(x, bounds, memo) - evaluate(y, bounds, memo)
        if d.empty or (d & need).empty:
            v = Interval(0, 0)
        elif d.lo >= need.lo:
            v = Interval(1, 1)
        else:
            v = Interval(0, 1)
    elif isinstance(e, And):
        parts = [evaluate(t, bounds, memo) for t in e.terms]
        v = Interval(min(p.lo for p in parts), min(p.hi for p in parts))
    else:  # pragma: no cover
        raise TypeError(f"unknown expression node {e!r}")
    memo[k] = v
    return v


def _narrow(e: Expr, target: Interval, bounds: dict[Col, Interval], memo: dict) -> None:
    """Top-down: constrain arithmetic node ``e`` to lie in ``target``."""
    cur = memo[id(e)] & target
    memo[id(e)] = cur
    if isinstance(e, Col):
        bounds[e] = bounds.get(e, UNBOUNDED) & cur
    elif isinstance(e, Add):  # z = x + y: x in Z - Y, y in Z - X
        xv, yv = memo[id(e.left)], memo[id(e.right)]
        _narrow(e.left, cur - yv, bounds, memo)
        _narrow(e.right, cur - xv, bounds, memo)
    elif isinstance(e, Sub):  # z = x - y: x in Z + Y, y in X - Z
        xv, yv = memo[id(e.left)], memo[id(e.right)]
        _narrow(e.left, cur + yv, bounds, memo)
        _narrow(e.right, xv - cur, bounds, memo)


def propagate(f: And, bounds: dict[Col, Interval], max_rounds: int = 8) -> dict[Col, Interval]:
    """Narrow every column's interval under the constraint that ``f`` is true.

    Returns the new bounds (a copy); an empty interval anywhere means no
    assignment within ``bounds`` can satisfy ``f``.
    """
    bounds = {c: bounds.get(c, UNBOUNDED) for c in columns(f)}
    for _ in range(max_rounds):
        before = dict(bounds)
        memo: dict = {}
        evaluate(f, bounds, memo)
        for t in f.terms:
            x, y, need = t.diff_bound()
            xv, yv = memo[id(x)], memo[id(y)]
            d = (xv - yv) & need  # x - y must lie in need
            _narrow(x, d + yv, bounds, memo)  # x in D + Y
            _narrow(y, memo[id(x)] - d, bounds, memo)  # y in X - D
        if any(b.empty for b in bounds.values()) or bounds == before:
            break
    return bounds


# --------------------------------------------------------------------------- exact per-pair form


def _linear(e: Expr) -> tuple[dict[Col, int], int]:
    if isinstance(e, Col):
        return {e: 1}, 0
    if isinstance(e, Const):
        return {}, int(e.value)
    if isinstance(e, Add | Sub):
        a, ca = _linear(e.left)
        b, cb = _linear(e.right)
        sign = 1 if isinstance(e, Add) else -1
        out = dict(a)
        for c, v in b.items():
            out[c] = out.get(c, 0) + sign * v
        return out, ca + sign * cb
    raise TypeError(f"{e!r} is not an arithmetic node")


def linear_form(f: And) -> list[tuple[dict[Col, int], int]]:
    """Each comparison as ``sum(coef * col) + c >= 0`` (strict ones shifted by 1)."""
    rows = []
    for t in f.terms:
        x, y, need = t.diff_bound()
        lx, cx = _linear(x)
        ly, cy = _linear(y)
        coef = dict(lx)
        for c, v in ly.items():
            coef[c] = coef.get(c, 0) - v
        rows.append(({c: v for c, v in coef.items() if v}, cx - cy - int(need.lo)))
    return rows
