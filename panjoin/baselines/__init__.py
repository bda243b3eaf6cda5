"""Peer join operators the benchmarks compare PanJoin against (issue 7).

- :mod:`~panjoin.baselines.symmetric_hash_join`: symmetric hash join with
  build-side pruning by interval arithmetic (DataFusion's SymmetricHashJoinExec);
- :mod:`~panjoin.baselines.sorted_list`: a ``sortedcontainers.SortedList`` per
  subwindow, plugged into the engine as the index kind ``sortedlist``;
- :mod:`~panjoin.baselines.duckdb_join`: the whole event file joined offline in DuckDB
  (the SQL, and :func:`~panjoin.baselines.duckdb_join.fetch_pairs`, the fetch every
  offline join shares);
- :mod:`~panjoin.baselines.polars_join`: the same in Polars expressions;
- :mod:`~panjoin.baselines.datafusion_join`: the same SQL in DataFusion.
"""
