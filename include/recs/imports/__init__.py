"""Bring your own graph: ``recs import`` loads CSV/TSV, Parquet or a SQL query's rows into one
table of the live store (follows, users, blocks, mutes, dismissals, interest tags) in one
transaction, through each backend's bulk path. ``tables`` (what each import reads, defaults,
reject reasons), ``sources`` (readers), ``validation``, ``staging`` (DuckDB: duplicates and sort
order), ``writers`` (the store's side), ``generation`` (``--generate-missing``), ``run`` (one
import). Design notes and measured speeds: ``README.md`` here and ``bench/README.md``."""
