"""The operator's view: the published versions and one run's report, as data, charts and pages.

``versions.versions_report`` (which version is current, which can be rolled back to) and
``content.run_report`` (stage timings, per-shard status and cost, the skew flag, the gate's
expectations and volume change, hub traffic, dbt's node results) assemble plain JSON-able
dicts from the files a run and a publish write; ``charts`` turns them into Vega-Lite specs
(Altair); ``pages`` renders the HTML; ``web.create_app`` serves it all as a FastAPI app. The
Airflow plugin (``plugins/recs_operator_view.py``) mounts that app in Airflow's API server and
passes in what only Airflow knows: its auth dependencies and the run's task instances. Nothing
here imports Airflow. Design notes: ``README.md`` beside this file.
"""
