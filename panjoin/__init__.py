"""PanJoin: a distributed sliding-window stream join (Qiu, Papadias, Yi's PanJoin paper).

The package is laid out like the paper:

- :mod:`panjoin.semantics`  window and predicate specs (DESIGN section 2), one parser
- :mod:`panjoin.reference`  the brute-force oracle (Kang's three-step procedure)
- :mod:`panjoin.events`     event files (Parquet/CSV) and their validation
- :mod:`panjoin.generate`   stream generators (uniform, Zipf, increasing, ...)
- :mod:`panjoin.subwindow`  the indexes: RaP-Table, WiB+-Tree, BI-Sort, nested loop
- :mod:`panjoin.manager`    the manager's five steps, in-process (``JoinEngine``)
- :mod:`panjoin.cli`        the ``panjoin`` command
"""

__version__ = "0.1.0"
