"""Named fields of JSON records in one Numba pass: no Python object per record.

The pipeline's records are one JSON object each, such as
``{"id": 7, "key": 1234, "ts": 1700000000123, "payload": "anything"}``, and the job
needs a few top-level fields as numbers. :func:`read_fields` walks every record
once, checks it against RFC 8259's grammar (objects, arrays, strings and their
escapes, numbers, literals; strict UTF-8), and reads each named field:

* an ``INT`` field when its value is an integer literal within int64;
* a ``FLOAT`` field when its value is a number: an integer literal within int64
  becomes the nearest float64 (as Python's ``float(int)``), any other literal is
  converted from its text by Arrow's cast, correctly rounded like Python's
  ``float(str)``; a literal beyond float64's range (``1e999``) is marked.

A record the kernel cannot vouch for is *marked*, not guessed: not a JSON object,
invalid JSON, a named field missing, repeated or of another kind (``"abc"``,
``1.5`` for an ``INT``, ``true``), an integer outside int64, nesting deeper than
64, text that is not strict UTF-8, ``NaN``. Keys are compared as Python reads them
(``"\\u0069d"`` is ``"id"``). The caller parses marked records with Python's
``json``, whose rules then decide (``1.0`` is an integer there, ``"abc"`` is a
reason for the dead-letter topic), so the kernel changes the speed, never the
outcome.

    >>> data = np.frombuffer(b'{"id": 7, "ts": -3}{"id": 1.5, "ts": 2}', np.uint8)
    >>> ints, floats, ok = read_fields(data, np.array([0, 19, 39]), [b"id", b"ts"],
    ...                                [INT, INT])
    >>> ints[0].tolist(), ok.tolist()
    ([7, -3], [True, False])
    >>> read_fields(data, np.array([0, 19, 39]), [b"id", b"ts"], [FLOAT, INT])[1][:, 0]
    array([7. , 1.5])

Trace of the first record: ``{`` opens the object; key ``"id"`` is field 0, its
value ``7`` an integer literal followed by ``,``; key ``"ts"`` is field 1, ``-3``
then ``}`` closes the object; nothing follows; both fields seen once: vouched for.
The second record's ``1.5`` stops the integer at ``.``, which is no delimiter
for an ``INT``: marked; for a ``FLOAT`` its text ``1.5`` is converted.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.kafka.record_batch import gather

#: field kinds for :func:`read_fields`
INT, FLOAT = 0, 1
#: nesting beyond this is marked (Python's json decides)
MAX_DEPTH = 64

_QUOTE, _BACKSLASH, _COLON, _COMMA = 34, 92, 58, 44
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93
_MINUS, _PLUS, _DOT, _ZERO, _NINE = 45, 43, 46, 48, 57


@njit(**NJIT, inline="always")
def _ws(buf, pos, end):
    while pos < end:
        c = buf[pos]
        if c != 32 and c != 9 and c != 10 and c != 13:
            break
        pos += 1
    return pos


@njit(**NJIT, inline="always")
def _cont(buf, pos, end, lo, hi):
    """A UTF-8 continuation byte within [lo, hi] at ``pos``."""
    return pos < end and lo <= buf[pos] <= hi


@njit(**NJIT)
def _utf8(buf, pos, end):
    """Length of the strict UTF-8 sequence at ``pos`` (lead byte >= 0x80), 0 if none
    (overlong forms, surrogates and code points past U+10FFFF are none)."""
    c = buf[pos]
    if 0xC2 <= c <= 0xDF:
        return 2 if _cont(buf, pos + 1, end, 0x80, 0xBF) else 0
    if 0xE0 <= c <= 0xEF:
        lo = 0xA0 if c == 0xE0 else 0x80
        hi = 0x9F if c == 0xED else 0xBF
        ok = _cont(buf, pos + 1, end, lo, hi) and _cont(buf, pos + 2, end, 0x80, 0xBF)
        return 3 if ok else 0
    if 0xF0 <= c <= 0xF4:
        lo = 0x90 if c == 0xF0 else 0x80
        hi = 0x8F if c == 0xF4 else 0xBF
        ok = (_cont(buf, pos + 1, end, lo, hi) and _cont(buf, pos + 2, end, 0x80, 0xBF)
              and _cont(buf, pos + 3, end, 0x80, 0xBF))
        return 4 if ok else 0
    return 0


@njit(**NJIT, inline="always")
def _hex(c):
    return (48 <= c <= 57) or (65 <= c <= 70) or (97 <= c <= 102)


@njit(**NJIT)
def _string(buf, pos, end):
    """``pos`` at an opening quote: (position after the closing quote, whether it
    holds an escape); position -1 when it is no valid string."""
    pos += 1
    esc = False
    while pos < end:
        c = buf[pos]
        if c == _QUOTE:
            return pos + 1, esc
        if c == _BACKSLASH:
            esc = True
            if pos + 1 >= end:
                return -1, esc
            e = buf[pos + 1]
            if e == 117:  # \uXXXX
                if pos + 5 >= end:
                    return -1, esc
                for j in range(2, 6):
                    if not _hex(buf[pos + j]):
                        return -1, esc
                pos += 6
            elif (e == _QUOTE or e == _BACKSLASH or e == 47 or e == 98 or e == 102
                  or e == 110 or e == 114 or e == 116):  # " \ / b f n r t
                pos += 2
            else:
                return -1, esc
        elif c < 32:  # control characters must be escaped
            return -1, esc
        elif c < 128:
            pos += 1
        else:
            n = _utf8(buf, pos, end)
            if n == 0:
                return -1, esc
            pos += n
    return -1, esc


@njit(**NJIT, inline="always")
def _digits(buf, pos, end):
    """Position after the run of ASCII digits at ``pos``."""
    while pos < end and _ZERO <= buf[pos] <= _NINE:
        pos += 1
    return pos


@njit(**NJIT)
def _integer(buf, pos, end):
    """The integer part of a JSON number at ``pos`` (``-?(0|[1-9][0-9]*)``): (position
    after it or -1, its value, whether it overflows int64)."""
    neg = pos < end and buf[pos] == _MINUS
    if neg:
        pos += 1
    if pos >= end or not (_ZERO <= buf[pos] <= _NINE):
        return -1, np.int64(0), False
    if buf[pos] == _ZERO:
        return pos + 1, np.int64(0), False
    a = pos
    mag = np.uint64(0)
    while pos < end and _ZERO <= buf[pos] <= _NINE:
        mag = mag * np.uint64(10) + np.uint64(buf[pos] - _ZERO)  # wraps past 19 digits
        pos += 1
    limit = np.uint64(9223372036854775808) if neg else np.uint64(9223372036854775807)
    if pos - a > 19 or mag > limit:
        return pos, np.int64(0), True
    if neg:
        return pos, np.int64(0) - np.int64(mag - np.uint64(1)) - np.int64(1), False
    return pos, np.int64(mag), False


@njit(**NJIT)
def _fraction_and_exponent(buf, pos, end):
    """Position after a number's optional ``.digits`` and ``e[+-]digits`` parts at
    ``pos``, -1 when one of them has no digit."""
    if pos < end and buf[pos] == _DOT:
        q = _digits(buf, pos + 1, end)
        if q == pos + 1:
            return -1
        pos = q
    if pos < end and (buf[pos] == 101 or buf[pos] == 69):  # e E
        pos += 1
        if pos < end and (buf[pos] == _PLUS or buf[pos] == _MINUS):
            pos += 1
        q = _digits(buf, pos, end)
        if q == pos:
            return -1
        pos = q
    return pos


@njit(**NJIT)
def _member_key(buf, pos, end):
    """An object member's ``"key" :`` at ``pos``: the position of its value (whitespace
    skipped), -1 when there is none."""
    if pos >= end or buf[pos] != _QUOTE:
        return -1
    pos = _string(buf, pos, end)[0]
    if pos < 0:
        return -1
    pos = _ws(buf, pos, end)
    if pos >= end or buf[pos] != _COLON:
        return -1
    return _ws(buf, pos + 1, end)


@njit(**NJIT)
def _skip(buf, pos, end, stack):
    """Validate the JSON value at ``pos`` (whitespace skipped before it) and return
    the position after it; -1 when it is invalid or nested deeper than the stack."""
    depth = 0
    while True:
        # a value begins at pos
        if pos >= end:
            return -1
        c = buf[pos]
        closed = False
        if c == _LBRACE or c == _LBRACKET:
            pos = _ws(buf, pos + 1, end)
            if pos >= end:
                return -1
            if buf[pos] == (_RBRACE if c == _LBRACE else _RBRACKET):
                pos += 1
                closed = True
            else:
                if depth >= len(stack):
                    return -1
                stack[depth] = c
                depth += 1
                if c == _LBRACE:
                    pos = _member_key(buf, pos, end)
                    if pos < 0:
                        return -1
                continue
        elif c == _QUOTE:
            pos, _ = _string(buf, pos, end)
            if pos < 0:
                return -1
            closed = True
        elif c == _MINUS or (_ZERO <= c <= _NINE):
            pos = _integer(buf, pos, end)[0]
            if pos < 0:
                return -1
            pos = _fraction_and_exponent(buf, pos, end)
            if pos < 0:
                return -1
            closed = True
        elif c == 116 or c == 110:  # true, null
            if pos + 4 > end:
                return -1
            if c == 116 and not (buf[pos + 1] == 114 and buf[pos + 2] == 117
                                 and buf[pos + 3] == 101):
                return -1
            if c == 110 and not (buf[pos + 1] == 117 and buf[pos + 2] == 108
                                 and buf[pos + 3] == 108):
                return -1
            pos += 4
            closed = True
        elif c == 102:  # false
            if pos + 5 > end or not (buf[pos + 1] == 97 and buf[pos + 2] == 108
                                     and buf[pos + 3] == 115 and buf[pos + 4] == 101):
                return -1
            pos += 5
            closed = True
        else:
            return -1
        # after a value: close containers, or go on to the next element
        while closed:
            if depth == 0:
                return pos
            pos = _ws(buf, pos, end)
            if pos >= end:
                return -1
            top = stack[depth - 1]
            c = buf[pos]
            if c == _COMMA:
                pos = _ws(buf, pos + 1, end)
                if top == _LBRACE:
                    pos = _member_key(buf, pos, end)
                    if pos < 0:
                        return -1
                closed = False
            elif (c == _RBRACE and top == _LBRACE) or (c == _RBRACKET and top == _LBRACKET):
                depth -= 1
                pos += 1
            else:
                return -1


@njit(**NJIT)
def _hex4(buf, pos):
    v = 0
    for i in range(4):
        c = buf[pos + i]
        v = v * 16 + (c - 48 if c <= 57 else (c - 55 if c <= 70 else c - 87))
    return v


@njit(**NJIT)
def _unescape(buf, a, b, out):
    """The UTF-8 bytes of the (valid) string body ``buf[a:b]`` with its escapes
    decoded, into ``out``: their count, or -1 when it holds a lone surrogate (which
    no field name holds). Never longer than ``b - a``."""
    q = 0
    while a < b:
        c = buf[a]
        if c != _BACKSLASH:
            out[q] = c
            q += 1
            a += 1
            continue
        e = buf[a + 1]
        if e != 117:
            out[q] = (8 if e == 98 else 12 if e == 102 else 10 if e == 110 else 13 if e == 114
                      else 9 if e == 116 else e)  # b f n r t, else " \ / themselves
            q += 1
            a += 2
            continue
        cp = _hex4(buf, a + 2)
        a += 6
        if 0xD800 <= cp <= 0xDBFF:  # a high surrogate: a low one must follow
            if a + 6 > b or buf[a] != _BACKSLASH or buf[a + 1] != 117:
                return -1
            lo = _hex4(buf, a + 2)
            if not 0xDC00 <= lo <= 0xDFFF:
                return -1
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            a += 6
        elif 0xDC00 <= cp <= 0xDFFF:
            return -1
        if cp < 0x80:
            out[q] = cp
            q += 1
        elif cp < 0x800:
            out[q] = 0xC0 | (cp >> 6)
            out[q + 1] = 0x80 | (cp & 0x3F)
            q += 2
        elif cp < 0x10000:
            out[q] = 0xE0 | (cp >> 12)
            out[q + 1] = 0x80 | ((cp >> 6) & 0x3F)
            out[q + 2] = 0x80 | (cp & 0x3F)
            q += 3
        else:
            out[q] = 0xF0 | (cp >> 18)
            out[q + 1] = 0x80 | ((cp >> 12) & 0x3F)
            out[q + 2] = 0x80 | ((cp >> 6) & 0x3F)
            out[q + 3] = 0x80 | (cp & 0x3F)
            q += 4
    return q


@njit(**NJIT)
def _field_of(buf, a, b, ndata, noffs):
    """Which name the raw key ``buf[a:b]`` is, or -1."""
    for j in range(len(noffs) - 1):
        na, nb = noffs[j], noffs[j + 1]
        if nb - na != b - a:
            continue
        same = True
        for i in range(b - a):
            if buf[a + i] != ndata[na + i]:
                same = False
                break
        if same:
            return j
    return -1


@njit(**NJIT)
def _record(buf, pos, end, ndata, noffs, kinds, ints, floats, spans, row, stack, key):
    """Read one record ``buf[pos:end]``: True when vouched for (fields stored; a
    ``FLOAT`` field that is no integer literal as NaN, with its text's span)."""
    k = len(kinds)
    pos = _ws(buf, pos, end)
    if pos >= end or buf[pos] != _LBRACE:
        return False
    pos = _ws(buf, pos + 1, end)
    seen = 0
    if pos < end and buf[pos] == _RBRACE:
        return False  # an empty object has none of the fields
    while True:
        if pos >= end or buf[pos] != _QUOTE:
            return False
        ka = pos + 1
        pos, esc = _string(buf, pos, end)
        if pos < 0:
            return False
        if esc:  # compare the key as Python's json reads it ("\u0069d" is "id")
            n = _unescape(buf, ka, pos - 1, key)
            j = _field_of(key, 0, n, ndata, noffs) if n >= 0 else -1
        else:
            j = _field_of(buf, ka, pos - 1, ndata, noffs)
        pos = _ws(buf, pos, end)
        if pos >= end or buf[pos] != _COLON:
            return False
        pos = _ws(buf, pos + 1, end)
        if j >= 0:
            if seen & (1 << j):
                return False  # repeated: Python keeps the last one; let it decide
            seen |= 1 << j
            a = pos
            pos, val, over = _integer(buf, pos, end)
            if pos < 0:
                return False
            is_int = pos >= end or not (buf[pos] == _DOT or buf[pos] == 101 or buf[pos] == 69)
            if kinds[j] == INT:
                if not is_int or over:
                    return False
                ints[row, j] = val
            elif is_int and not over:
                floats[row, j] = np.float64(val)  # Python: float(int), +0.0 for -0
            else:  # a fraction, an exponent, or an integer beyond int64: from its text
                pos = _fraction_and_exponent(buf, pos, end)
                if pos < 0:
                    return False
                floats[row, j] = np.nan  # converted from its text afterwards
                spans[row, j, 0] = a
                spans[row, j, 1] = pos - a
        elif pos < end and buf[pos] == _QUOTE:  # the usual other fields: a string
            pos = _string(buf, pos, end)[0]
            if pos < 0:
                return False
        else:
            pos = _skip(buf, pos, end, stack)
            if pos < 0:
                return False
        pos = _ws(buf, pos, end)
        if pos >= end:
            return False
        if buf[pos] == _COMMA:
            pos = _ws(buf, pos + 1, end)
        elif buf[pos] == _RBRACE:
            pos += 1
            break
        else:
            return False
    return _ws(buf, pos, end) == end and seen == (1 << k) - 1


@njit(**NJIT)
def _read(data, offs, ndata, noffs, kinds):
    n = len(offs) - 1
    k = len(kinds)
    has_float = False
    for j in range(k):
        has_float |= kinds[j] == FLOAT
    ints = np.zeros((n, k), np.int64)
    floats = np.zeros((n if has_float else 0, k), np.float64)
    spans = np.zeros((n if has_float else 0, k, 2), np.int64)
    ok = np.zeros(n, np.bool_)
    stack = np.empty(MAX_DEPTH, np.uint8)
    longest = 0
    for i in range(n):
        longest = max(longest, offs[i + 1] - offs[i])
    key = np.empty(longest, np.uint8)  # an escaped key, decoded
    for i in range(n):
        ok[i] = _record(data, offs[i], offs[i + 1], ndata, noffs, kinds, ints, floats,
                        spans, i, stack, key)
    return ints, floats, spans, ok


def read_fields(data: np.ndarray, offs: np.ndarray, names, kinds):
    """Fields ``names`` (bytes, top level) of records ``data[offs[i]:offs[i+1]]``, of
    ``kinds`` (:data:`INT` or :data:`FLOAT` each): ``(ints, floats, ok)`` with
    ``ints[i, j]`` (an ``INT`` field) or ``floats[i, j]`` (a ``FLOAT`` one) valid
    where ``ok[i]``. At most 62 names. O(bytes)."""
    if not 0 < len(names) <= 62 or len(names) != len(kinds):
        raise ValueError(f"give 1 to 62 field names, one kind each (got {len(names)} "
                         f"names and {len(kinds)} kinds)")
    ndata = np.frombuffer(b"".join(names), np.uint8)
    noffs = np.zeros(len(names) + 1, np.int64)
    noffs[1:] = np.cumsum([len(x) for x in names])
    data = np.asarray(data, np.uint8)
    ints, floats, spans, ok = _read(data, np.asarray(offs, np.int64), ndata, noffs,
                                    np.asarray(kinds, np.uint8))
    if not len(floats):
        floats = np.zeros((len(ok), len(names)), np.float64)
    for j in np.flatnonzero(np.asarray(kinds) == FLOAT).tolist():
        text = np.flatnonzero(ok & np.isnan(floats[:, j]))
        if len(text):  # decimal literals: Arrow's cast rounds as Python's float() does
            d, o = gather(data, spans[text, j, 0].copy(), spans[text, j, 1].copy())
            arr = pa.Array.from_buffers(pa.large_string(), len(text),
                                        [None, pa.py_buffer(o), pa.py_buffer(d)])
            f = arr.cast(pa.float64()).to_numpy()
            floats[text, j] = f
            ok[text[~np.isfinite(f)]] = False  # beyond float64: Python's json decides
    return ints, floats, ok
