"""The nightly run (ARCHITECTURE §2): one function per stage, each called by one Airflow task
and by the CLI (``pipeline``). Design notes: ``README.md`` here."""
