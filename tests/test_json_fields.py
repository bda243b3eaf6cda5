"""The Numba JSON field reader against Python's json, the rules it stands in for.

Two properties over generated records, some of them mangled byte by byte:
*sound*: a record the kernel vouches for is one Python's json parses into an object
whose fields have the kernel's values, bit for bit; *complete*: a record that
``json.dumps`` wrote, with each field an integer within int64 (or any finite
number, for a FLOAT field), is vouched for, so the fast path is really taken.
"""

from __future__ import annotations

import doctest
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panjoin.kafka import json_fields
from panjoin.kafka.json_fields import FLOAT, INT, MAX_DEPTH, read_fields

I64 = (-(1 << 63), (1 << 63) - 1)
NAMES = [b"id", b"key", b"ts"]


def _read(recs: list[bytes], kinds, names=NAMES):
    data = np.frombuffer(b"".join(recs), np.uint8)
    offs = np.zeros(len(recs) + 1, np.int64)
    offs[1:] = np.cumsum([len(r) for r in recs])
    return read_fields(data, offs, names, kinds)


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _python(rec: bytes, kinds, names=NAMES):
    """What Python's json makes of the record's fields: their values, or None where
    the kernel must not vouch (not an object, a field missing or of another kind)."""
    try:
        obj = json.loads(rec)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    out = []
    for name, kind in zip(names, kinds, strict=True):
        v = obj.get(name.decode(), None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if kind == INT:
            if not isinstance(v, int) or not I64[0] <= v <= I64[1]:
                return None
            out.append(v)
        else:
            f = float(v)
            if not math.isfinite(f):
                return None
            out.append(f)
    return out


def _check_sound(recs, kinds, names=NAMES):
    ints, floats, ok = _read(recs, kinds, names)
    for i, rec in enumerate(recs):
        if not ok[i]:
            continue
        want = _python(rec, kinds, names)
        assert want is not None, f"vouched for {rec!r}, which Python's json refuses"
        for j, (kind, w) in enumerate(zip(kinds, want, strict=True)):
            if kind == INT:
                assert ints[i, j] == w, rec
            else:
                assert _bits(floats[i, j]) == _bits(w), (rec, floats[i, j], w)
    return ok


def test_doctests():
    assert doctest.testmod(json_fields).failed == 0


# --------------------------------------------------------------------------- cases

CASES = [  # (record, vouched for) with fields id, key, ts all INT
    (b'{"id": 1, "key": 2, "ts": 3}', True),
    (b' \t\r\n{"ts":3,"key":2,"id":1}\n ', True),
    (b'{"id": -9223372036854775808, "key": 9223372036854775807, "ts": -0}', True),
    (b'{"id": 9223372036854775808, "key": 2, "ts": 3}', False),  # past int64
    (b'{"id": -9223372036854775809, "key": 2, "ts": 3}', False),
    (b'{"id": 123456789012345678901234, "key": 2, "ts": 3}', False),
    (b'{"id": 1.0, "key": 2, "ts": 3}', False),  # Python's json: a float
    (b'{"id": 1e3, "key": 2, "ts": 3}', False),
    (b'{"id": 01, "key": 2, "ts": 3}', False),  # no leading zeros in JSON
    (b'{"id": -, "key": 2, "ts": 3}', False),
    (b'{"id": +1, "key": 2, "ts": 3}', False),
    (b'{"id": "1", "key": 2, "ts": 3}', False),
    (b'{"id": true, "key": 2, "ts": 3}', False),
    (b'{"id": null, "key": 2, "ts": 3}', False),
    (b'{"id": NaN, "key": 2, "ts": 3}', False),
    (b'{"id": 1, "key": 2}', False),  # a field missing
    (b'{"id": 1, "key": 2, "ts": 3, "id": 4}', False),  # repeated: Python keeps the last
    (b'{"\\u0069d": 1, "key": 2, "ts": 3}', True),  # an escaped key spelling a field
    (b'{"\\u0069d": 1, "id": 1, "key": 2, "ts": 3}', False),  # so "id" comes twice
    (b'{"i\\"d": 1, "id": 1, "key": 2, "ts": 3, "\\ud800": 0, "\\ud83d\\ude00": 0}', True),
    (b'{"id": 1, "key": 2, "ts": 3,}', False),
    (b'{"id": 1, "key": 2, "ts": 3} {}', False),  # extra data
    (b'{"id": 1 "key": 2, "ts": 3}', False),
    (b'{"id": 1, "key": 2, "ts": 3', False),
    (b'[{"id": 1, "key": 2, "ts": 3}]', False),
    (b'\xef\xbb\xbf{"id": 1, "key": 2, "ts": 3}', False),  # a byte-order mark
    (b'{"id": 1, "key": 2, "ts": 3, "p": "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}', True),
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\xc3"}', False),  # cut UTF-8
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\xc0\xaf"}', False),  # overlong
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\xed\xa0\x80"}', False),  # a surrogate
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\xf4\x90\x80\x80"}', False),  # past U+10FFFF
    (b'{"id": 1, "key": 2, "ts": 3, "p": "a\tb"}', False),  # a raw control character
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\\ud83d\\ude00 \\" \\\\ \\/ \\b\\f\\n\\r\\t"}', True),
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\\x"}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": "\\u12g4"}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [1, -2.5e-3, 0.0, 1E+9, {"a": [true, false, null]},'
     b' [], {}, ""]}', True),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [1.]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [.5]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [1e]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [tru]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": {"a" 1}}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [1 2]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": [1,]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": {"a": 1]}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": Infinity}', False),
    (b'{"id": 1, "key": 2, "ts": 3, "p": ' + b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH + b"}",
     True),
    (b'{"id": 1, "key": 2, "ts": 3, "p": ' + b"[" * (MAX_DEPTH + 1) + b"1"
     + b"]" * (MAX_DEPTH + 1) + b"}", False),  # deeper than the kernel goes: json decides
    (b"", False),
    (b"{}", False),
    (b"not json", False),
    (b'{"id": 1, "key": 2, "ts": 3}\x00', False),
]


@pytest.mark.parametrize("rec,vouched", CASES, ids=range(len(CASES)))
def test_cases(rec, vouched):
    ints, _, ok = _read([rec], [INT, INT, INT])
    assert bool(ok[0]) == vouched, rec
    _check_sound([rec], [INT, INT, INT])
    if vouched:
        assert ints[0].tolist() == [json.loads(rec)[n] for n in ("id", "key", "ts")]


@pytest.mark.parametrize("lit", [b"0", b"-0", b"1.5", b"-0.0", b"1e300", b"-2.5E-7",
                                 b"5e-324", b"1.7976931348623157e308", b"9007199254740993",
                                 b"9223372036854775807", b"0.1", b"123456.78901234567891",
                                 b"2.2250738585072011e-308", b"1e999", b"-1e999",
                                 b"1.0000000000000002220446049250313080847263336181640625"])
def test_float_fields_round_as_python(lit):
    rec = b'{"id": 1, "key": ' + lit + b', "ts": 3}'
    _, floats, ok = _read([rec], [INT, FLOAT, INT])
    py = float(json.loads(rec)["key"])
    assert bool(ok[0]) == math.isfinite(py)  # 1e999: Python's json decides (inf)
    if ok[0]:
        assert _bits(floats[0, 1]) == _bits(py)
    _check_sound([rec], [INT, FLOAT, INT])


def test_nothing_read_from_nested_objects_or_other_names():
    recs = [b'{"x": {"id": 1, "key": 2, "ts": 3}}', b'{"idx": 1, "key": 2, "ts": 3}',
            b'{"ID": 1, "key": 2, "ts": 3}']
    assert not _read(recs, [INT, INT, INT])[2].any()


def test_names_of_other_lengths_and_bytes():
    names = [b"event_time", "kl\u00e9".encode(), b"i"]
    rec = '{"i": 5, "event_time": 6, "kl\u00e9": -7}'.encode()
    ints, _, ok = _read([rec], [INT, INT, INT], names)
    assert ok[0] and ints[0].tolist() == [6, -7, 5]
    escaped = json.dumps({"i": 5, "event_time": 6, "kl\u00e9": -7, "\U0001f600": 1}).encode()
    assert b"\\u00e9" in escaped  # json.dumps escapes non-ASCII keys by default
    ints, _, ok = _read([escaped], [INT, INT, INT], names)
    assert ok[0] and ints[0].tolist() == [6, -7, 5]
    with pytest.raises(ValueError, match="1 to 62"):
        _read([rec], [], [])


# --------------------------------------------------------------------------- properties

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_scalar = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
           | st.floats(allow_nan=False, allow_infinity=False) | _text)
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(_text, c, max_size=3), max_leaves=8)
_field = (st.integers(*I64) | st.integers(-(1 << 70), 1 << 70)
          | st.floats(allow_nan=False, allow_infinity=False) | _scalar)


@st.composite
def _record(draw):
    """A JSON object (as bytes, and whether its fields are ints within int64 and
    finite numbers) with some fields of its own, maybe mangled."""
    obj = draw(st.dictionaries(_text, _value, max_size=3))
    for name in ("id", "key", "ts"):
        if draw(st.integers(0, 9)):  # mostly present
            obj[name] = draw(_field)
    keys = list(obj)
    order = draw(st.permutations(keys))
    obj = {k: obj[k] for k in order}
    sep = draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,\n", " :\t")]))
    raw = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=sep).encode()
    raw = draw(st.sampled_from([b"", b" ", b"\n"])) + raw + draw(st.sampled_from([b"", b"\r\n"]))
    mangled = False
    for _ in range(draw(st.integers(0, 3)) if draw(st.booleans()) else 0):
        at = draw(st.integers(0, len(raw)))
        byte = draw(st.sampled_from(list(b'{}[]",:\\ 0.-eE+a\x00') + [0x80, 0xC3, 0xFF]))
        how = draw(st.integers(0, 2))
        raw = (raw[:at] + bytes([byte]) + raw[at + (how > 0):] if how < 2
               else raw[:at] + raw[at + 1:])
        mangled = True
    return raw, mangled


@settings(max_examples=250, deadline=None)
@given(st.lists(_record(), min_size=1, max_size=12), st.sampled_from([INT, FLOAT]))
def test_sound_and_complete_against_pythons_json(recs, key_kind):
    kinds = [INT, key_kind, INT]
    ok = _check_sound([r for r, _ in recs], kinds)
    for (rec, mangled), got in zip(recs, ok, strict=True):
        if not mangled and _python(rec, kinds) is not None:
            assert got, f"a well-formed record was not vouched for: {rec!r}"


def test_a_float_field_holding_an_integer_beyond_int64():
    """Found by the property above: Python reads it as a float, so must the kernel."""
    rec = b'{"": null, "id": 0, "key": 18446744071025197055, "ts": 0}'
    assert _check_sound([rec], [INT, FLOAT, INT]).all()
    data = np.frombuffer(rec, np.uint8)
    _, floats, ok = read_fields(data, np.array([0, len(rec)]), [b"key"], [FLOAT])
    assert ok.all() and floats[0, 0] == float(18446744071025197055)
