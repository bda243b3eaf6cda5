"""``python -m panjoin.cli``: the ``panjoin`` command."""

import sys

from panjoin.cli.main import main

sys.exit(main())
