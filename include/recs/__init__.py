"""recs: a who-to-follow data platform (nightly capped two-hop traversal, served online).

One subpackage per component of the design (``store``, ``ingest``, ``nightly``, ``cli``,
``demo``; ``testing`` for tests only) over a few shared leaves; README "Layout" maps them.
Importing ``recs``, a package's ``__init__`` or the light modules (``config``, ``assets``,
``errors``, ``times``, ``sharding``, ``nightly.runs``) loads no heavy library: DAG files import
them at parse time.
"""

__version__ = "0.1.0"
