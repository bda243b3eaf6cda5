"""Event files: round trips, every validation error, atomic writes (panjoin.events)."""

from __future__ import annotations

import doctest
import importlib
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panjoin import events as ev
from panjoin.events import (
    EventError,
    EventTable,
    read_events,
    read_ids,
    read_pairs,
    write_events,
    write_ids,
    write_pairs,
)

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max
HEADER = "stream,id,key,ts\n"
EVENT_MODULES = ["errors", "arrays", "validate", "table", "csv_text", "files", "results"]


def table(stream="RSRS", ids=None, keys=None, ts=None, payload=None) -> EventTable:
    codes = np.array(["RS".index(c) for c in stream], dtype=np.uint8)
    n = len(codes)
    if ids is None:  # rank within the stream
        c = np.cumsum(codes, dtype=np.int64)
        ids = np.where(codes == 1, c - 1, np.arange(n) - c)
    keys = np.arange(n) * 10 if keys is None else keys
    ts = np.arange(n) + 1_700_000_000_000 if ts is None else ts
    return EventTable(codes, np.asarray(ids), np.asarray(keys), np.asarray(ts), payload)


def csv_file(tmp_path, text: str, name: str = "events.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def parquet_file(tmp_path, cols: dict, name: str = "events.parquet"):
    p = tmp_path / name
    pq.write_table(pa.table(cols), p)
    return p


def expect(path_or_fn, *fragments, row=None):
    """read_events(path) (or fn()) raises an EventError naming the data row and
    containing every fragment."""
    with pytest.raises(EventError) as info:
        if callable(path_or_fn):
            path_or_fn()
        else:
            read_events(path_or_fn)
    msg = str(info.value)
    if row is not None:
        assert f"data row {row}:" in msg, msg
        assert info.value.row == row
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return info.value


def no_leftovers(directory, *keep):
    """Nothing but the named files in the directory: no temp file survived."""
    assert sorted(os.listdir(directory)) == sorted(keep)


# --------------------------------------------------------------------------- round trips

TRICKY_FLOATS = [5.0, -0.0, 0.1, 1 / 3, 1e300, -1e-300, 5e-324, 2.0**53 + 2, -123456.789, 1e20]
TRICKY_PAYLOADS = ["plain", "a,b", 'say "hi"', "two\nlines", "ünïcödé ✓", "", "  padded  "]


@pytest.mark.parametrize("suffix", [".parquet", ".pq", ".csv"])
def test_round_trip_int_extremes(tmp_path, suffix):
    keys = np.array([I64_MIN, I64_MAX, 0, -1, I64_MIN + 1, I64_MAX - 1, 2**53 + 1, -(2**53) - 1])
    t = table(
        "RSRSRSRS",
        ids=[I64_MIN, I64_MAX, I64_MAX, I64_MIN, 0, 0, 7, -7],
        keys=keys,
        ts=[I64_MIN, I64_MAX, 0, -5, 1, 2, 3, 4],
        payload=pa.array(TRICKY_PAYLOADS + ["x"]),
    )
    p = tmp_path / f"e{suffix}"
    write_events(t, p)
    back = read_events(p)
    assert back.key.dtype == np.int64
    assert back.equals(t)
    assert back.key.tolist() == keys.tolist()  # exactly, not via doubles
    no_leftovers(tmp_path, p.name)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_round_trip_floats_bit_exact(tmp_path, suffix):
    rng = np.random.default_rng(1)
    keys = np.concatenate(
        [TRICKY_FLOATS, rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)]
    )
    stream = "".join(rng.choice(["R", "S"], keys.size))
    t = table(stream, keys=keys)
    p = tmp_path / f"e{suffix}"
    write_events(t, p)
    back = read_events(p)
    assert back.key.dtype == np.float64
    assert back.equals(t)  # bit for bit, -0.0 included
    assert np.signbit(back.key[1])


def test_integral_float_keys_stay_float_in_csv(tmp_path):
    t = table("RS", keys=np.array([5.0, 6.0]))
    p = tmp_path / "e.csv"
    write_events(t, p)
    assert "5.0" in p.read_text()
    assert read_events(p).key.dtype == np.float64


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_round_trip_no_payload_and_empty(tmp_path, suffix):
    for t in (table("RSSR"), table("", keys=np.zeros(0, np.int64))):
        p = tmp_path / f"e{suffix}"
        write_events(t, p)
        back = read_events(p)
        assert back.payload is None and back.equals(t)


def test_payload_bytes_and_nulls(tmp_path):
    t = table("RSR", payload=pa.array([b"\x00\xff", None, b"abc"], pa.binary()))
    write_events(t, tmp_path / "e.parquet")
    assert read_events(tmp_path / "e.parquet").equals(t)
    # CSV: UTF-8 bytes travel as text, a null payload comes back as ''
    t = table("RSR", payload=pa.array([b"caf\xc3\xa9", None, b"x,y"], pa.binary()))
    write_events(t, tmp_path / "e.csv")
    assert read_events(tmp_path / "e.csv").payload.to_pylist() == ["café", "", "x,y"]
    # bytes that are no text cannot go to CSV, and nothing is written
    t = table("R", payload=pa.array([b"\xff\xfe"], pa.binary()))
    expect(lambda: write_events(t, tmp_path / "bin.csv"), "UTF-8", "parquet")
    assert not (tmp_path / "bin.csv").exists()
    no_leftovers(tmp_path, "e.parquet", "e.csv")


def test_parquet_accepts_other_integer_and_time_types(tmp_path):
    p = parquet_file(
        tmp_path,
        {
            "ts": pa.array([1000, 2000, 3000], pa.timestamp("us")),
            "key": pa.array([1.5, 2.5, -3.0], pa.float32()),
            "extra": pa.array(["ignored", "as", "well"]),
            "id": pa.array([1, 2**63 - 1, 3], pa.uint64()),
            "stream": pa.array(["R", "S", "R"]).dictionary_encode(),
        },
    )
    t = read_events(p)
    assert t.stream.tolist() == [0, 1, 0]
    assert t.id.tolist() == [1, 2**63 - 1, 3]
    assert t.key.dtype == np.float64 and t.key.tolist() == [1.5, 2.5, -3.0]
    assert t.ts.tolist() == [1, 2, 3]  # microseconds to ms
    p = parquet_file(
        tmp_path,
        {
            "stream": pa.array(["S", "R"], pa.large_string()),
            "id": pa.array([0, 0], pa.int32()),
            "key": pa.array([7, 8], pa.int16()),
            "ts": pa.array([5.0, 6.0]),  # integral doubles are fine
        },
        "b.parquet",
    )
    t = read_events(p)
    assert t.key.dtype == np.int64 and t.ts.tolist() == [5, 6] and t.ts.dtype == np.int64


def test_csv_forgiving_number_formats(tmp_path):
    p = csv_file(
        tmp_path,
        "\ufeffts,key,stream,id,extra\r\n"  # BOM, other order, CRLF, an extra column
        " 10 ,+5,R, +0 ,x\r\n"
        "11,-5,S,1.0,y\r\n"
        "1.2e1,7,R,1e0,z\r\n",
    )
    t = read_events(p)
    assert t.id.tolist() == [0, 1, 1] and t.ts.tolist() == [10, 11, 12]
    assert t.key.dtype == np.int64 and t.key.tolist() == [5, -5, 7]
    # one decimal point anywhere makes the whole key column float64
    p = csv_file(tmp_path, HEADER + "R,0,9223372036854775807,1\nS,0,2.5,1\n")
    t = read_events(p)
    assert t.key.dtype == np.float64 and t.key.tolist() == [2.0**63, 2.5]
    # a mix of plain and integral-float ids keeps the plain ones exact
    p = csv_file(tmp_path, HEADER + "R,9223372036854775807,1,1\nS,3.0,1,1\n")
    assert read_events(p).id.tolist() == [I64_MAX, 3]


def test_arrow_conversion_and_table_ops():
    t = table("RSRRS", keys=np.array([5, 1, 4, 2, 3]), payload=pa.array(list("abcde")))
    at = t.to_arrow()
    assert at.column_names == ["stream", "id", "key", "ts", "payload"]
    assert at.column("stream").to_pylist() == list("RSRRS")
    assert EventTable.from_arrow(at).equals(t)
    assert t.counts() == (3, 2) and len(t) == 5
    s = t.slice(1, 4)
    assert s.key.tolist() == [1, 4, 2] and s.payload.to_pylist() == list("bcd")
    assert len(t.slice(4, 2)) == 0 and t.slice(-2, 99).key.tolist() == [2, 3]
    k = t.take(np.array([4, 0]))
    assert k.id.tolist() == [1, 0] and k.payload.to_pylist() == ["e", "a"]
    assert t.take(t.stream == 1).payload.to_pylist() == ["b", "e"]
    both = EventTable.concat([t.slice(0, 2), t.slice(2, 5)])
    assert both.equals(t)
    assert not t.equals(t.take(np.array([1, 0, 2, 3, 4])))
    with pytest.raises(ValueError, match="differ in length"):
        EventTable(np.zeros(2, np.uint8), np.arange(3), np.arange(2), np.arange(2))
    with pytest.raises(TypeError):
        EventTable(np.zeros(2, np.uint8), np.arange(2.0), np.arange(2), np.arange(2))


def test_from_arrow_chunked_columns():
    """Many chunks, each stream chunk with its own dictionary: rows count across chunks."""

    def tags(*parts):
        return pa.chunked_array([pa.array(list(p)).dictionary_encode() for p in parts])

    cols = {
        "stream": tags("RS", "SRR"),  # dictionaries ['R', 'S'] and ['S', 'R']
        "id": pa.chunked_array([[0, 0], [1, 1], [2]]),
        "key": pa.chunked_array([[1.5], [2.5, 3.5, 4.5, 5.5]]),
        "ts": pa.chunked_array([[1, 2, 3], [4, 5]]),
        "payload": pa.chunked_array([["a", "b"], ["c", "d", "e"]]),
    }
    t = EventTable.from_arrow(pa.table(cols))
    assert t.stream.tolist() == [0, 1, 1, 0, 0] and t.id.tolist() == [0, 0, 1, 1, 2]
    assert t.key.tolist() == [1.5, 2.5, 3.5, 4.5, 5.5] and t.payload.to_pylist() == list("abcde")
    assert t.key.flags.writeable
    expect(lambda: EventTable.from_arrow(pa.table({**cols, "stream": tags("RS", "SxR")})), row=4)
    bad_ts = pa.chunked_array([[1, 2, 3], [4, None]])
    expect(
        lambda: EventTable.from_arrow(pa.table({**cols, "ts": bad_ts})),
        "'ts' is empty (null)",
        row=5,
    )
    empty = {c: pa.chunked_array([], type=v.type) for c, v in cols.items()}
    assert len(EventTable.from_arrow(pa.table(empty))) == 0


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_read_arrays_are_writeable(tmp_path, suffix):
    """Arrow hands out read-only views; read_events must give arrays the caller
    may edit and sort in place, which own their data (the file is not touched)."""
    p = tmp_path / f"e{suffix}"
    written = table("RSRS", keys=np.array([30, 20, 10, 0]), ts=np.array([4, 3, 2, 1]))
    write_events(written, p)
    t = read_events(p)
    for name in ("stream", "id", "key", "ts"):
        assert getattr(t, name).flags.writeable, name
    t.key[0] = 99
    t.ts.sort()
    t.id[:] = -1
    assert t.key.tolist() == [99, 20, 10, 0]
    assert t.ts.tolist() == [1, 2, 3, 4]
    assert t.id.tolist() == [-1, -1, -1, -1]
    assert read_events(p).equals(written)  # the edits went to our copy only


# --------------------------------------------------------------------------- validation


def test_missing_and_duplicate_columns(tmp_path):
    expect(
        csv_file(tmp_path, "stream,id,key\nR,0,1\n"), "missing column 'ts'", "stream, id, key, ts"
    )
    expect(csv_file(tmp_path, "stream,key\nR,0\n"), "missing columns 'id', 'ts'")
    p = parquet_file(tmp_path, {"stream": ["R"], "id": [0], "ts": [1]})
    expect(p, "missing column 'key'")
    expect(csv_file(tmp_path, "stream,id,key,ts,id\nR,0,1,1,2\n"), "'id' appears more than once")
    expect(lambda: EventTable.from_arrow(pa.table({"stream": ["R"]})), "<table>", "missing")


@pytest.mark.parametrize("tag", ["r", "s", "X", "RS", "R ", "0"])
def test_unknown_stream_tag(tmp_path, tag):
    text = HEADER + "R,0,1,1\nS,0,1,2\n" + f"{tag},5,1,3\n"
    e = expect(csv_file(tmp_path, text), repr(tag), "only 'R' and 'S' are allowed", row=3)
    assert e.column == "stream"
    if tag in ("r", "s"):
        assert "case-sensitive" in str(e)
    p = parquet_file(tmp_path, {"stream": ["R", tag], "id": [0, 1], "key": [1, 2], "ts": [1, 2]})
    expect(p, repr(tag), "'R' and 'S'", row=2)


def test_wrong_types_parquet(tmp_path):
    good = {"stream": ["R", "S"], "id": [0, 0], "key": [1, 2], "ts": [1, 2]}

    def with_(**cols):
        return parquet_file(tmp_path, {**good, **cols})

    expect(with_(id=["0", "1"]), "column 'id' has type string", "'0'", "int64", row=1)
    expect(with_(id=[True, False]), "column 'id' has type bool", row=1)
    expect(with_(key=[True, False]), "column 'key' has type bool", "int64 or float64", row=1)
    expect(with_(key=["1", "2"]), "column 'key' has type string", row=1)
    expect(with_(stream=[0, 1]), "column 'stream' has type int64", "'R' or 'S'", row=1)
    expect(with_(ts=[1.0, 2.5]), "column 'ts' has 2.5", "not a whole number", "millisecond", row=2)
    expect(with_(id=[1.0, 1e30]), "outside the int64 range", row=2)
    expect(with_(payload=[1, 2]), "column 'payload' has type int64", "string or binary", row=1)
    expect(with_(id=pa.array([1, 2**63], pa.uint64())), "above the int64 maximum", row=2)
    expect(with_(ts=pa.array([1000, 1500], pa.timestamp("us"))), "whole millisecond", row=2)


def test_wrong_types_csv(tmp_path):
    expect(csv_file(tmp_path, HEADER + "R,0,1,1\nS,x1,1,1\n"), "'x1'", "not a number", row=2)
    expect(csv_file(tmp_path, HEADER + "R,0,1,1\nS,0,1,1.5\n"), "1.5", "not a whole number", row=2)
    expect(csv_file(tmp_path, HEADER + "R,0,1,1\nS,0,1,true\n"), "'true'", "not a number", row=2)
    expect(csv_file(tmp_path, HEADER + "R,0,1,1\nS,0,abc,1\n"), "'abc'", "not a number", row=2)
    expect(csv_file(tmp_path, HEADER + "R,0,1,1\nS,0,1.5,1\nR,1,hello,1\n"), "'hello'", row=3)
    big = "9223372036854775808"
    expect(csv_file(tmp_path, HEADER + f"R,0,1,1\nS,0,{big},1\n"), big, "int64 range", row=2)
    expect(csv_file(tmp_path, HEADER + f"R,0,1,1\nS,-{big}1,1,1\n"), "int64 range", row=2)
    # the earliest of several problems in one column is the one reported
    text = HEADER + "R,0,1,1\nS,0,1,2\nR,1,1,2.5\nR,2,1,99999999999999999999\n"
    expect(csv_file(tmp_path, text), "2.5", row=3)
    text = HEADER + "R,0,1,1\nS,0,1,2\nR,1,1,99999999999999999999\nR,2,1,2.5\n"
    expect(csv_file(tmp_path, text), "int64 range", row=3)


@pytest.mark.parametrize(
    "text, what",
    [("nan", "NaN"), ("NaN", "NaN"), ("inf", "+inf"), ("-inf", "-inf"), ("1e400", "+inf")],
)
def test_nan_and_infinite_keys(tmp_path, text, what):
    p = csv_file(tmp_path, HEADER + f"R,0,1.5,1\nS,0,2,1\nR,1,{text},1\n")
    expect(p, f"column 'key' is {what}", "finite", row=3)


def test_nan_key_parquet(tmp_path):
    p = parquet_file(
        tmp_path,
        {"stream": list("RSR"), "id": [0, 0, 1], "key": [1.0, np.nan, 2.0], "ts": [1, 2, 3]},
    )
    expect(p, "is NaN", row=2)
    bad = table("RS", keys=np.array([1.0, -np.inf]))
    expect(lambda: bad.validate("mine"), "mine, data row 2", "-inf")


@pytest.mark.parametrize("col", ["stream", "id", "key", "ts"])
def test_nulls_and_empty_fields(tmp_path, col):
    cols = {
        "stream": ["R", "S", "R", "S"],
        "id": [0, 0, 1, 1],
        "key": [1, 2, 3, 4],
        "ts": [1, 2, 3, 4],
    }
    cols[col] = list(cols[col])
    cols[col][2] = None
    expect(parquet_file(tmp_path, cols), f"column {col!r} is empty (null)", "fill it in", row=3)
    rows = [["R", "0", "1", "1"], ["S", "0", "2", "2"], ["R", "1", "3", "3"]]
    rows[1][["stream", "id", "key", "ts"].index(col)] = ""
    text = HEADER + "".join(",".join(r) + "\n" for r in rows)
    expect(csv_file(tmp_path, text), f"column {col!r} is empty (null)", row=2)


def test_earliest_null_across_columns(tmp_path):
    cols = {"stream": ["R", "S", "R"], "id": [0, 0, None], "key": [1, None, 3], "ts": [1, 2, 3]}
    expect(parquet_file(tmp_path, cols), "column 'key' is empty (null)", row=2)


def test_null_payload_is_fine(tmp_path):
    cols = {"stream": ["R", "S"], "id": [0, 0], "key": [1, 2], "ts": [1, 2], "payload": ["a", None]}
    assert read_events(parquet_file(tmp_path, cols)).payload.to_pylist() == ["a", None]


def test_duplicate_ids_name_both_rows(tmp_path):
    text = HEADER + "R,0,1,1\nS,0,1,1\nR,7,1,1\nS,1,1,1\nR,3,1,1\nS,2,1,1\nR,7,1,1\nS,1,1,1\n"
    e = expect(csv_file(tmp_path, text), "id 7 of stream R repeats data row 3", "unique", row=7)
    assert e.column == "id"
    # the earliest repeat wins, whichever stream it is in
    text = HEADER + "R,0,1,1\nS,5,1,1\nS,5,1,1\nR,0,1,1\n"
    expect(csv_file(tmp_path, text), "id 5 of stream S repeats data row 2", row=3)
    # the same id in the two streams is fine, ids need not be ordered
    text = HEADER + "R,5,1,1\nS,5,1,1\nR,-3,1,1\nS,2,1,1\n"
    assert read_events(csv_file(tmp_path, text)).id.tolist() == [5, 5, -3, 2]


def test_file_level_errors(tmp_path):
    expect(tmp_path / "nope.parquet", "nope.parquet", "file not found")
    expect(tmp_path / "nope.csv", "file not found")
    (tmp_path / "e.txt").write_text(HEADER)
    expect(tmp_path / "e.txt", "unknown event file suffix '.txt'", ".parquet", ".csv")
    (tmp_path / "events").write_text(HEADER)
    expect(tmp_path / "events", "no suffix")
    (tmp_path / "d.csv").mkdir()
    expect(tmp_path / "d.csv", "is a directory")
    (tmp_path / "junk.parquet").write_text(HEADER + "R,0,1,1\n")
    expect(tmp_path / "junk.parquet", "not a readable Parquet file", ".csv")
    expect(csv_file(tmp_path, "", "empty.csv"), "the file is empty")
    expect(csv_file(tmp_path, HEADER + "R,0,1\n", "ragged.csv"), "not a readable CSV file")
    (tmp_path / "locked.csv").write_text(HEADER)
    os.chmod(tmp_path / "locked.csv", 0)
    try:
        if os.access(tmp_path / "locked.csv", os.R_OK):
            pytest.skip("running as root: permissions are not enforced")
        expect(tmp_path / "locked.csv", "cannot be read", "permission")
    finally:
        os.chmod(tmp_path / "locked.csv", 0o644)


def test_bad_stream_code_in_memory(tmp_path):
    t = table("RS")
    t.stream[1] = 2
    expect(lambda: t.validate(), "stream code 2", row=2)
    expect(lambda: write_events(t, tmp_path / "never.parquet"), "stream code 2")
    no_leftovers(tmp_path)


def test_validation_is_vectorised(tmp_path):
    """A 2M-row file whose only problem is in its last row: found without a
    Python loop over rows (seconds, not minutes)."""
    n = 2_000_000
    codes = np.zeros(n, np.uint8)
    codes[1::2] = 1
    ids = np.arange(n) // 2
    ids[-1] = 5  # S id 5 again, at the very end
    keys = np.random.default_rng(0).random(n)
    t = EventTable(codes, ids, keys, np.arange(n))
    p = tmp_path / "big.parquet"
    pq.write_table(t.to_arrow(), p)
    t0 = time.perf_counter()
    expect(p, f"id 5 of stream S repeats data row {2 * 5 + 2}", row=n)
    q = tmp_path / "big.csv"
    ids[-1] = n  # unique again; now a NaN key in the last row
    keys[-1] = np.nan
    t2 = EventTable(codes, ids, keys, np.arange(n))
    pcsv.write_csv(t2.to_arrow(), q)
    expect(q, "is NaN", row=n)
    assert time.perf_counter() - t0 < 30  # ~2-4 s here; a row loop would take minutes


# --------------------------------------------------------------------------- atomic writes


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def half_write(tbl, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", half_write)
    target = tmp_path / "e.parquet"
    expect(lambda: write_events(table("RS"), target), "cannot be written", "No space left")
    assert not target.exists()
    no_leftovers(tmp_path)
    # an existing file survives a failed overwrite untouched
    target.write_bytes(b"old contents")
    expect(lambda: write_events(table("RS"), target), "cannot be written")
    assert target.read_bytes() == b"old contents"
    def no_space(self, tbl, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", no_space)
    expect(lambda: write_pairs(tmp_path / "p.parquet", [1], [2]), "cannot be written")
    expect(lambda: write_ids(tmp_path / "l.parquet", {"R": [1]}), "cannot be written")
    no_leftovers(tmp_path, "e.parquet")


def test_interrupted_write_cleans_up_and_reraises(tmp_path, monkeypatch):
    def boom(tbl, where, **kw):
        with open(where, "wb") as f:
            f.write(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(pcsv, "write_csv", boom)
    with pytest.raises(KeyboardInterrupt):
        write_events(table("RS"), tmp_path / "e.csv")
    no_leftovers(tmp_path)


def test_invalid_table_is_not_written(tmp_path):
    dup = table("RR", ids=[3, 3])
    expect(lambda: write_events(dup, tmp_path / "e.parquet"), "id 3 of stream R", row=2)
    no_leftovers(tmp_path)
    expect(lambda: write_events(table("RS"), tmp_path / "no" / "e.csv"), "does not exist")
    expect(lambda: write_events(table("RS"), tmp_path / "e.json"), "suffix '.json'")
    no_leftovers(tmp_path)


def test_write_replaces_and_respects_umask(tmp_path):
    p = tmp_path / "e.parquet"
    write_events(table("RS"), p)
    write_events(table("RSR"), p)
    assert len(read_events(p)) == 3
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask
    no_leftovers(tmp_path, "e.parquet")


# --------------------------------------------------------------------------- pairs and ids


@pytest.mark.parametrize("name", ["pairs.parquet", "pairs.csv", "pairs.out"])
def test_pairs_round_trip(tmp_path, name):
    r = np.array([I64_MIN, 0, I64_MAX, 5])
    s = np.array([I64_MAX, -1, I64_MIN, 5])
    write_pairs(tmp_path / name, r, s)
    got = read_pairs(tmp_path / name)
    assert got.dtype == np.int64 and got.shape == (4, 2)
    assert got.tolist() == np.stack([r, s], axis=1).tolist()
    write_pairs(tmp_path / name, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert read_pairs(tmp_path / name).shape == (0, 2)
    no_leftovers(tmp_path, name)
    if name.endswith(".parquet"):
        schema = pq.read_schema(tmp_path / name)
        assert schema.names == ["r_id", "s_id"] and schema.field("r_id").type == pa.int64()


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("name", ["pairs.parquet", "pairs.csv"])
def test_pairs_writer_streams_row_groups(tmp_path, name, background, monkeypatch):
    """Pairs written in pieces come back whole and in order; the file appears only at
    close, row groups leave as they fill (not all at the end), and payload columns are
    kept across pieces."""
    import panjoin.events.results as results

    monkeypatch.setattr(results, "PAIRS_ROW_GROUP", 5)
    rng = np.random.default_rng(7)
    r = rng.integers(I64_MIN, I64_MAX, 23, dtype=np.int64, endpoint=True)
    s = rng.integers(I64_MIN, I64_MAX, 23, dtype=np.int64, endpoint=True)
    pay = pa.array([f"p{i}" for i in range(23)], pa.large_string())
    path = tmp_path / name
    with results.PairsWriter(path, background=background) as out:
        for a, b in ((0, 3), (3, 3), (3, 11), (11, 23)):
            out.write(r[a:b], s[a:b], pay[a:b], pay[a:b])
            assert not path.exists()
        assert out.rows == 23
        if background:
            out._stop_thread(drain=False)  # the groups handed over are on disk
        if name.endswith(".parquet"):
            (tmp,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            assert tmp.stat().st_size > 0  # two groups of 5 pairs already out
    assert read_pairs(path).tolist() == np.stack([r, s], axis=1).tolist()
    if name.endswith(".parquet"):
        f = pq.ParquetFile(path)
        assert f.metadata.num_row_groups == 5  # 5, 5, 5, 5, 3
        assert f.read().column("s_payload").to_pylist() == pay.to_pylist()
    no_leftovers(tmp_path, name)


def test_pairs_writer_abandoned_or_failing_leaves_nothing(tmp_path):
    import panjoin.events.results as results

    path = tmp_path / "p.parquet"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="join failed"):
        with results.PairsWriter(path) as out:
            out.write([1, 2], [3, 4])
            raise RuntimeError("join failed")
    assert path.read_bytes() == b"old"
    no_leftovers(tmp_path, "p.parquet")
    out = results.PairsWriter(path)
    out.write([1], [2], pa.array(["x"]), None)
    with pytest.raises(ValueError, match="payload columns differ"):
        out.write([1], [2])
    out.abort()
    out.abort()  # twice is harmless
    assert path.read_bytes() == b"old"
    no_leftovers(tmp_path, "p.parquet")


def test_pairs_writer_thread_failure_comes_back_and_leaves_nothing(tmp_path, monkeypatch):
    """A row group that fails on the writing thread fails the caller's next call with an
    error that says how to fix it; the thread ends and the partial file is removed."""
    import threading

    import panjoin.events.results as results

    monkeypatch.setattr(results, "PAIRS_ROW_GROUP", 4)
    real = pq.ParquetWriter.write_table
    calls = []

    def second_fails(self, tbl, **kw):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(self, tbl, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", second_fails)
    path = tmp_path / "p.parquet"
    out = results.PairsWriter(path, background=True)
    with pytest.raises(EventError, match="No space left"):
        for i in range(100):
            out.write(np.arange(4) + 4 * i, np.arange(4))
            time.sleep(0.01)
    assert set(calls) == {"panjoin-pairs-writer"}
    assert out._thread is None and not path.exists()
    no_leftovers(tmp_path)
    out.abort()  # after the failure: nothing left to do


def test_pairs_errors(tmp_path):
    with pytest.raises(ValueError, match="2 r_ids but 1 s_ids"):
        write_pairs(tmp_path / "p.parquet", [1, 2], [3])
    pq.write_table(pa.table({"r_id": [1]}), tmp_path / "p.parquet")
    expect(lambda: read_pairs(tmp_path / "p.parquet"), "missing column 's_id'")
    expect(lambda: read_pairs(tmp_path / "none.parquet"), "file not found")


def test_ids_round_trip(tmp_path):
    p = tmp_path / "late.parquet"
    write_ids(p, {"S": np.array([9, I64_MIN]), "R": np.array([3, 1, 2])})
    at = pq.read_table(p)
    assert at.column("stream").to_pylist() == ["R", "R", "R", "S", "S"]
    got = read_ids(p)
    assert got["R"].tolist() == [3, 1, 2] and got["S"].tolist() == [9, I64_MIN]
    write_ids(tmp_path / "late.csv", {0: [1], 1: []})
    got = read_ids(tmp_path / "late.csv")
    assert got["R"].tolist() == [1] and got["S"].tolist() == []
    with pytest.raises(ValueError, match="neither 'R' nor 'S'"):
        write_ids(p, {"T": [1]})


# --------------------------------------------------------------------------- properties

keys_int = st.lists(st.integers(I64_MIN, I64_MAX), min_size=0, max_size=40)
keys_float = st.lists(
    st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=0, max_size=40
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.one_of(keys_int, keys_float),
    data=st.data(),
    suffix=st.sampled_from([".parquet", ".csv"]),
)
def test_round_trip_property(tmp_path, keys, data, suffix):
    n = len(keys)
    codes = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    ids = data.draw(st.lists(st.integers(I64_MIN, I64_MAX), min_size=n, max_size=n, unique=True))
    ts = data.draw(st.lists(st.integers(I64_MIN, I64_MAX), min_size=n, max_size=n))
    text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
    payload = data.draw(st.none() | st.lists(text, min_size=n, max_size=n))
    is_float = any(isinstance(k, float) for k in keys)
    t = EventTable(
        np.array(codes, np.uint8),
        np.array(ids, np.int64),
        np.array(keys, np.float64 if is_float else np.int64),
        np.array(ts, np.int64),
        None if payload is None else pa.array(payload, pa.string()),
    )
    p = tmp_path / f"prop{suffix}"
    write_events(t, p)
    assert read_events(p).equals(t)


@pytest.mark.parametrize("module", EVENT_MODULES)
def test_doctests(module):
    mod = importlib.import_module(f"panjoin.events.{module}")
    assert doctest.testmod(mod).failed == 0


def test_package_reexports():
    """Everything other code imports from panjoin.events is still there, and the
    package's modules cover its docstring's module map."""
    for name in ev.__all__:
        assert hasattr(ev, name), name
    for module in EVENT_MODULES:
        assert f"    {module} " in ev.__doc__, module


@settings(max_examples=200, deadline=None)
@given(data=st.data(), chunk=st.sampled_from([1, 2, 3, 7, 1 << 20]))
def test_ids_rise_checked_in_chunks(data, chunk):
    """The chunked check that ids rise within each stream agrees with the check over the
    whole column, however the chunks cut the streams (ids from a few values: repeats,
    equal neighbours and falls across a chunk's edge all come up); and where ids do not
    rise, a repeat is still found and reported at the earliest row that repeats."""
    from panjoin.events import validate as v

    n = data.draw(st.integers(0, 40))
    codes = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
    ids = np.array(data.draw(st.lists(st.integers(-3, 3) | st.integers(I64_MIN, I64_MAX),
                                      min_size=n, max_size=n)), np.int64)
    # compared, not subtracted: np.diff wraps around at int64's ends (3 then -2^63 + 2
    # "rose" by the wrapped difference)
    want = all(bool(np.all(w[1:] > w[:-1])) for w in (ids[codes == c] for c in (0, 1)))
    old = v.RISE_CHUNK
    v.RISE_CHUNK = chunk
    try:
        assert v._ids_rise(codes, ids) == want
        dup = next((i for i in range(n) if any(codes[j] == codes[i] and ids[j] == ids[i]
                                               for j in range(i))), None)
        if dup is None:
            v._check_unique_ids(codes, ids, "<t>")
        else:
            with pytest.raises(EventError) as e:
                v._check_unique_ids(codes, ids, "<t>")
            assert f"row {dup + 1}" in str(e.value)
    finally:
        v.RISE_CHUNK = old
