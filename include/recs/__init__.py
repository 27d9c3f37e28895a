"""recs: a who-to-follow data platform (nightly capped two-hop traversal, served online).

Importing ``recs`` or its light modules (``config``, ``runs``, ``assets``, ``errors``,
``sharding``) loads no heavy library: DAG files import them at parse time.
"""

__version__ = "0.1.0"
