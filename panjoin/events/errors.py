"""How a bad event file or table is reported: :class:`EventError`, and ``_fail``,
which words every message the same way::

    <file>, data row <n>: <problem>; <how to fix it>

The data row is 1-based and does not count the header; it is left out where it
does not apply (a missing file, a missing column). ``_show`` cuts a quoted value
short. Used by every other module of :mod:`panjoin.events`.

    >>> e = _fail("events.csv", "column 'key' is NaN", "keys must be finite numbers",
    ...           row=5, column="key")
    >>> str(e)
    "events.csv, data row 5: column 'key' is NaN; keys must be finite numbers"
    >>> (e.source, e.row, e.column)
    ('events.csv', 5, 'key')
"""

from __future__ import annotations


class EventError(ValueError):
    """A bad event file or table. The message names the file, the 1-based data row
    (header not counted) and the problem, and says how to fix it; ``source``,
    ``row`` and ``column`` hold the same facts for programs (None where they do not
    apply, e.g. a missing file)."""

    def __init__(self, message: str, *, source=None, row=None, column=None):
        super().__init__(message)
        self.source = source
        self.row = row
        self.column = column


def _fail(source, problem: str, fix: str = "", *, row=None, column=None) -> EventError:
    where = f"{source}" if row is None else f"{source}, data row {row}"
    msg = f"{where}: {problem}"
    if fix:
        msg += f"; {fix}"
    return EventError(msg, source=str(source), row=row, column=column)


def _show(value) -> str:
    """A value as it appears in a message: repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
