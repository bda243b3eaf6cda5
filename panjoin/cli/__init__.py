"""The ``panjoin`` command, one module per subcommand (each registers its parser and
sets its ``run``), the options they share in :mod:`panjoin.cli.options`, and the
parser and ``main`` in :mod:`panjoin.cli.main`:

- :mod:`.replay`  join an event file (in-process, local cluster, manager, handshake)
- :mod:`.gen`     generate an event file
- :mod:`.bench`   ``bench index|system|peers``
- :mod:`.serve`   ``cluster``, ``manager``, ``worker``, ``handshake-node``
- :mod:`.demo`    the join alone through a local cluster

``panjoin kafka`` and ``panjoin pipeline`` are registered from their own packages
(:mod:`panjoin.kafka.cli`, :mod:`spark_conn.cli`) with the same shared options.
This package imports nothing itself, so importing an option module loads no command.
"""
