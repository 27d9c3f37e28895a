# One image for every container of docker-compose.yml that runs our code: the Airflow API
# server, scheduler, DAG processor, triggerer and Celery workers, the recs read API and the
# one-off `recs` command (recs-cli). Everything is installed here, at build time: the pinned
# requirements.txt (the set `make test` runs, Airflow and its Celery provider included) and the
# `recs` package itself, non-editable. A container installs nothing when it starts, so the
# source can stay out of it and nothing needs a writable code folder.
#
#   docker compose build          (or: docker build -t recs-platform:local .)
#
# python:3.11-slim rather than apache/airflow: that image brings its own constraint set and
# providers, which would not be the versions requirements.txt pins and the tests run.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# uid 50000 as in Airflow's own image; gid 0 so an orchestrator's arbitrary uid still writes.
RUN useradd --create-home --uid 50000 --gid 0 recs

WORKDIR /opt/recs
COPY requirements.txt ./
RUN pip install -r requirements.txt && pip check

# The package, from a wheel into site-packages (no -e: nothing points back at /opt/recs/include).
COPY pyproject.toml README.md ./
COPY include/ include/
RUN pip install --no-deps . && rm -rf build include/*.egg-info

# What Airflow and dbt read at run time. The dbt project has no packages (no `dbt deps`); its
# target and logs go under each run's folder (recs.nightly.models), so it stays read-only.
COPY dags/ dags/
COPY plugins/ plugins/
COPY dbt_project/ dbt_project/

# RECS_HOME (the shared volume docker-compose mounts here) and AIRFLOW_HOME (its logs volume):
# created owned by recs, so a new named volume mounted on them starts owned by recs too.
RUN mkdir -p /var/lib/recs /opt/airflow/logs /home/recs/.cache/numba \
    && chown -R recs:0 /var/lib/recs /opt/airflow /home/recs/.cache \
    && chmod -R g+rwX /var/lib/recs /opt/airflow /home/recs/.cache

ENV RECS_HOME=/var/lib/recs \
    RECS_DBT_PROJECT_DIR=/opt/recs/dbt_project \
    DBT_PROFILES_DIR=/opt/recs/dbt_project \
    DBT_SEND_ANONYMOUS_USAGE_STATS=false \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/recs/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/recs/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    NUMBA_CACHE_DIR=/home/recs/.cache/numba

USER recs
CMD ["recs", "--help"]
