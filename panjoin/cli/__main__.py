"""``python -m panjoin.cli``: the ``panjoin`` command."""

from panjoin.cli.main import entry

entry()
