"""Data for demos, tests and benchmarks: the bundled real graphs (``datasets``) with their
generated fields (``generated``), synthetic power-law graphs (``synthetic``) and a synthetic
upstream event stream (``event_stream``)."""
