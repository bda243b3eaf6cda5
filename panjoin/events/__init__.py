"""Event files: the recorded, arrival-ordered input of a join (DESIGN section 2).

An event file is Parquet (``.parquet``/``.pq``) or CSV (``.csv``) with one row
per tuple, in ARRIVAL order, and these columns::

    stream   'R' or 'S' (case-sensitive)          which input stream the tuple belongs to
    id       int64, unique within its stream      what the result pairs name
    key      int64 or float64, finite             the join field
    ts       int64, milliseconds                  event time (time windows, lateness)
    payload  string or bytes, optional, nullable  opaque; the join never looks at it
    key2     float64, optional, finite            second attribute, for a residual condition
                                                  (e.g. predicate 'band:10&band2:10')

Other columns are ignored. In memory the same sequence is an :class:`EventTable`:
numpy columns (``stream`` as uint8, 0 = R, 1 = S) plus the payload as a pyarrow
array, so that ten million rows cost four flat arrays and no Python objects.

Reading validates everything and either returns a whole table or raises one
:class:`EventError` that names the file, the 1-based data row (the header is not
counted) and the problem, and says how to fix it::

    file ──► suffix ──► pyarrow reader ──► column types ──► values ──► EventTable
             .parquet    (CSV: explicit    nulls, bool,     tags R/S,
             .pq .csv     types, never     strings, int     finite keys,
                          inferred; key    range, integral  unique ids
                          read as text)    floats           per stream

One job per module; each imports only those above it in this list::

    errors    EventError and the wording of its messages
    arrays    numpy/pyarrow helpers: first True of a mask, column to numpy, combine chunks
    validate  the column contract and its checks and conversions (nulls, types, stream
              tags, int/float/key/key2/payload columns, unique ids), with a worked trace
    table     EventTable: construction, slice/take/concat/equals, to_arrow/from_arrow
    csv_text  CSV parsing and CSV-specific number conversions (both ways)
    files     read_events / write_events: format by suffix, readability, atomic writes
    results   result files: write_pairs / read_pairs (PairsWriter: as they come),
              write_ids / read_ids

Everything other code uses is imported from here, ``panjoin.events``.
"""

from panjoin.events.errors import EventError
from panjoin.events.files import CSV_SUFFIXES, PARQUET_SUFFIXES, read_events, write_events
from panjoin.events.results import PairsWriter, read_ids, read_pairs, write_ids, write_pairs
from panjoin.events.table import EventTable
from panjoin.events.validate import COLUMNS, REQUIRED, STREAM_TAGS

__all__ = [
    "COLUMNS",
    "CSV_SUFFIXES",
    "PARQUET_SUFFIXES",
    "REQUIRED",
    "STREAM_TAGS",
    "EventError",
    "EventTable",
    "read_events",
    "read_ids",
    "read_pairs",
    "write_events",
    "write_ids",
    "write_pairs",
    "PairsWriter",
]
