"""``python -m recs.cli``: the same as the ``recs`` command."""

from recs.cli import entry

entry()
