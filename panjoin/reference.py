"""Brute-force reference join: the oracle every index, topology and backend is tested against.

It follows DESIGN section 2 literally and shares no code with the engine beyond
the spec parser:

- count windows, Kang's three-step procedure: for each arriving tuple t, in
  arrival order, (1) scan the last W tuples of the opposite stream for matches,
  (2) insert t into its own window, (3) let the oldest tuple fall out;
- time windows: a tuple is late iff its ts is below the largest ts seen before
  it (both streams) minus the allowed lateness; non-late r and s join iff
  ``r.ts - TS < s.ts < r.ts + TR``, whatever the arrival order.

A residual condition (``pred.residual``, e.g. ``band:10&band2:10``) is checked the
same way on ``key2`` (float64), for every candidate pair the key condition passes.

Keys are compared exactly: int64 differences in Python integers, float64
differences exactly (Fractions near a band edge); window bounds are Python integers
too, so ts at the ends of int64 never wrap. Quadratic: keep inputs small.

    >>> import numpy as np
    >>> from panjoin.semantics import parse_window, parse_predicate
    >>> ref = reference_join(np.array([0, 1, 0]), np.array([1, 2, 3]),
    ...                      np.array([5, 5, 9]), np.array([0, 1, 2]),
    ...                      parse_window("count:1,1"), parse_predicate("eq"))
    >>> ref.pairs.tolist()   # r#1 joins s#2; r#3 arrives after s#2 but key 9 != 5
    [[1, 2]]
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from panjoin.semantics import I64_MAX, I64_MIN, Predicate, Window


@dataclass
class ReferenceResult:
    pairs: np.ndarray  # (n, 2) int64 (r_id, s_id), sorted
    late_ids: dict[str, np.ndarray]  # stream -> ids of late tuples, arrival order


def _key_match(probe_key, stored: np.ndarray, pred: Predicate, probe_is_r: bool) -> np.ndarray:
    """Mask of stored keys matching a probe key; bands are on s.key - r.key."""
    if stored.size == 0:
        return np.zeros(0, dtype=bool)
    if stored.dtype == np.float64:
        # beyond float64: +-inf, still on the right side of every finite edge
        with np.errstate(over="ignore"):
            d = stored - probe_key if probe_is_r else probe_key - stored
            # exact: a float difference near an edge is re-checked in rational arithmetic
            inside = np.zeros(stored.shape, dtype=bool)
            near = np.zeros(stored.shape, dtype=bool)
            for a, b in pred.bands:
                for edge in (a, b):
                    if np.isfinite(edge):
                        tol = (1e-9 * max(abs(edge), 1.0) + 1e-9 * np.abs(stored)
                               + 1e-9 * abs(probe_key))
                        near |= np.abs(d - edge) <= tol
                inside |= (d >= a) & (d <= b)
        for i in np.flatnonzero(near):
            exact = (
                Fraction(float(stored[i])) - Fraction(float(probe_key))
                if probe_is_r
                else Fraction(float(probe_key)) - Fraction(float(stored[i]))
            )
            inside[i] = any(Fraction(a) <= exact <= Fraction(b) for a, b in pred.bands)
    else:
        py = np.array([int(x) for x in stored], dtype=object)
        pk = int(probe_key)
        d = py - pk if probe_is_r else pk - py
        inside = np.zeros(stored.shape, dtype=bool)
        for a, b in pred.bands:
            inside |= np.array([a <= x <= b for x in d], dtype=bool)
    return ~inside if pred.negated else inside


def _match(i, cand, keys, key2, pred: Predicate, probe_is_r: bool) -> np.ndarray:
    """Mask over stored positions ``cand`` matching probe position ``i``: key, then residual."""
    m = _key_match(keys[i], keys[cand], pred, probe_is_r)
    if pred.residual is not None:
        m &= _key_match(key2[i], key2[cand], pred.residual, probe_is_r)
    return m


def reference_join(
    stream: np.ndarray,
    ids: np.ndarray,
    keys: np.ndarray,
    ts: np.ndarray,
    window: Window,
    pred: Predicate,
    key2: np.ndarray | None = None,
) -> ReferenceResult:
    """Join an arrival-ordered event sequence. ``stream`` holds 0 for R, 1 for S;
    ``key2`` (float64) is needed iff ``pred`` has a residual condition."""
    if pred.residual is not None:
        if key2 is None:
            raise ValueError(f"predicate {pred} has a residual on key2: pass key2")
        key2 = np.asarray(key2, dtype=np.float64)
    stream = np.asarray(stream)
    ids = np.asarray(ids, dtype=np.int64)
    keys = np.asarray(keys)
    ts = np.asarray(ts, dtype=np.int64)
    out_r: list[np.ndarray] = []
    out_s: list[np.ndarray] = []
    late = {"R": [], "S": []}
    if window.kind == "count":
        pos = {0: [], 1: []}  # arrival positions per stream
        for i in range(len(stream)):
            x = int(stream[i])
            opp = pos[1 - x]
            w = window.s if x == 0 else window.r  # size of the opposite window
            cand = np.array(opp[-w:], dtype=np.int64)
            if cand.size:
                m = _match(i, cand, keys, key2, pred, probe_is_r=(x == 0))
                hit = ids[cand[m]]
                mine = np.full(hit.shape, ids[i])
                out_r.append(mine if x == 0 else hit)
                out_s.append(hit if x == 0 else mine)
            pos[x].append(i)
    else:
        maxts = None
        keep = np.zeros(len(stream), dtype=bool)
        for i in range(len(stream)):
            t = int(ts[i])
            if maxts is not None and t < maxts - window.lateness:
                late["R" if stream[i] == 0 else "S"].append(int(ids[i]))
            else:
                keep[i] = True
            maxts = t if maxts is None else max(maxts, t)
        r_idx = np.flatnonzero(keep & (stream == 0))
        s_idx = np.flatnonzero(keep & (stream == 1))
        s_ts = ts[s_idx]
        for i in r_idx:
            # r.ts - TS < s.ts < r.ts + TR, in Python integers (no int64 wrap at the ends),
            # as the closed int64 range they leave: [r.ts - TS + 1, r.ts + TR - 1] clamped
            t = int(ts[i])
            first, last = max(t - window.s + 1, I64_MIN), min(t + window.r - 1, I64_MAX)
            near = s_idx[(s_ts >= first) & (s_ts <= last)]
            if near.size:
                m = _match(i, near, keys, key2, pred, probe_is_r=True)
                hit = ids[near[m]]
                out_r.append(np.full(hit.shape, ids[i]))
                out_s.append(hit)
    if out_r:
        pairs = np.stack([np.concatenate(out_r), np.concatenate(out_s)], axis=1).astype(np.int64)
    else:
        pairs = np.zeros((0, 2), dtype=np.int64)
    return ReferenceResult(
        pairs=sort_pairs(pairs),
        late_ids={k: np.array(v, dtype=np.int64) for k, v in late.items()},
    )


def sort_pairs(pairs: np.ndarray) -> np.ndarray:
    """Pairs in (r_id, s_id) lexicographic order, for comparing result sets."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return pairs[order]
