"""Test support, imported by tests and benchmarks only, never by a product module (an
import-linter contract checks it): a throwaway PostgreSQL server (``pgserver``), the design's
algorithm in plain Python to cross-check the kernel (``reference``), and a plain reader of
published lists (``published``)."""
