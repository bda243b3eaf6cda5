"""``python -m panjoin.cli``: the ``panjoin`` command."""

from panjoin.cli.process import entry

entry()
