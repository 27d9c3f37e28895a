"""``python -m recs.cli``: the same as the ``recs`` command."""

import sys

from recs.cli import main

sys.exit(main())
