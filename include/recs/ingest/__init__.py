"""Event ingestion (ARCHITECTURE §2): the upstream relationship event stream, applied to the
live store idempotently, last writer wins per relationship, bad lines quarantined. The event
semantics and the write path: ``README.md`` here."""
