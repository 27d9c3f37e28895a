"""The online read path: published lists validated against the live store, cold start, the API.

Modules, in the order a request meets them: ``server`` (uvicorn and its limits), ``api``
(FastAPI routes), ``auth`` (bearer tokens), ``versions`` and ``coordination`` (which published
version answers), ``read_path`` (``who_to_follow``), ``filters`` (read-time checks against the
live store), ``cold_start``, ``live_store`` (the pooled store connection), ``metrics``.
``README.md`` beside this file has the design reasoning.
"""
