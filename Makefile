# One obvious way to run everything. `make` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed

# All state lives under RECS_HOME; Airflow's metadata DB (SQLite) and logs live inside it.
export RECS_HOME ?= $(CURDIR)/data
export AIRFLOW_HOME ?= $(RECS_HOME)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export DBT_PROFILES_DIR := $(CURDIR)/dbt_project
export PATH := $(BIN):$(PATH)

# The fixed reference date of the generated fields of the real datasets (recs.demo.generated).
DEMO_DATE := 2026-11-01
DEMO_USERS := 1 5 2494
DUCKDB_POOL := recs_duckdb_writer

.PHONY: help venv demo test test-fast lint bench bench-scale evaluate dbt-docs airflow-ui airflow-ui-stop clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	@echo "[setup] creating .venv and installing the pinned requirements.txt (first use only, about a minute) ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	@echo "[setup] .venv ready"
	touch $@

venv: $(STAMP) ## Create .venv and install the pinned requirements (first use only)

$(AIRFLOW_HOME)/airflow.db: $(STAMP)
	@echo "[setup] creating Airflow's metadata DB in $(AIRFLOW_HOME) (airflow db migrate) ..."
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/db-migrate.log 2>&1 || (tail -20 $(AIRFLOW_HOME)/db-migrate.log; exit 1)

demo: $(STAMP) $(AIRFLOW_HOME)/airflow.db ## Load soc-Slashdot0902, run the nightly DAG for DEMO_DATE, show results
	@echo "[1/4] loading soc-Slashdot0902 into the live store ($(RECS_HOME)/live.db) ..."
	$(BIN)/recs load-dataset slashdot --replace
	@$(BIN)/airflow pools set $(DUCKDB_POOL) 1 "one DuckDB writer at a time" > /dev/null
	@echo "[2/4] running the DAG recs_who_to_follow_nightly for $(DEMO_DATE) with airflow dags test" \
		"(a few minutes; full log: $(RECS_HOME)/demo-dag.log); each task as it starts and ends:"
	@$(BIN)/python scripts/dag_progress.py $(RECS_HOME)/demo-dag.log -- \
		$(BIN)/airflow dags test recs_who_to_follow_nightly $(DEMO_DATE)
	@echo "[3/4] stage times from Airflow's task records:"
	@$(BIN)/airflow tasks states-for-dag-run recs_who_to_follow_nightly $(DEMO_DATE) -o json 2>/dev/null \
		| $(BIN)/python bench/stage_times.py
	@echo "[4/4] what was published:"
	$(BIN)/recs runs
	$(BIN)/recs summary --snapshot-date $(DEMO_DATE)
	@for u in $(DEMO_USERS); do $(BIN)/recs recommend $$u; done
	@echo "The run's report, Data Docs and dbt results in Airflow's UI: make airflow-ui (README, \"Operating it\")."

# ruff; the architecture's import contracts (import-linter, pyproject.toml); sqlfluff on the dbt
# project (its .sqlfluff says why the jinja templater).
define lint_steps
	$(BIN)/ruff check dags plugins include tests bench scripts
	$(BIN)/lint-imports
	cd dbt_project && $(BIN)/sqlfluff lint models tests macros
endef

test: $(STAMP) postgres-server redis-server chromium ## Install everything, then lint, dbt parse and docs, and run every test (what CI runs)
	$(lint_steps)
	cd dbt_project && $(BIN)/dbt parse --quiet --vars '{run_dir: /tmp/recs-dbt-parse}'
	mkdir -p /tmp/recs-dbt-docs && cd dbt_project && $(BIN)/dbt docs generate --quiet --empty-catalog \
		--vars '{run_dir: /tmp/recs-dbt-docs, snapshot_date: 2026-11-01}' --target-path /tmp/recs-dbt-docs/target --log-path /tmp/recs-dbt-docs/logs
	RECS_REQUIRE_POSTGRES=1 RECS_REQUIRE_REDIS=1 RECS_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q --durations=25 tests

test-fast: $(STAMP) ## Unit and DAG tests only (skips slow real-data tests)
	$(BIN)/python -m pytest -q -m "not slow" tests

lint: $(STAMP) ## ruff, the import contracts (lint-imports) and sqlfluff on the dbt project
	$(lint_steps)

# Both benchmarks use their own RECS_HOME under /tmp (never data/); e.g.
#   make bench BENCH_ARGS="--users 1000000 --shards 16"    make bench-scale SCALE_ARGS="--reuse-store"
bench: $(STAMP) ## Traversal benchmark: ours vs pure Python vs DuckDB SQL, side by side
	$(BIN)/python bench/traversal.py $(BENCH_ARGS)

# The night at 1 M users / 50 M edges (16 shards) in /tmp/recs-scale; at 5 M / 250 M:
#   make bench-scale SCALE_ARGS="--users 5000000 --shards 80 --home /tmp/recs-scale-5m"
# (80 shards: the same users per shard; its SQLite store alone takes 38 GB of disk while it is
# generated, 16 GB after, so check the free space first: bench/README.md).
bench-scale: $(STAMP) ## 1 M users / 50 M edges through every nightly stage: time, memory, night model
	$(BIN)/python bench/scale_run.py $(SCALE_ARGS)

# Issue 13: the four real graphs, the five baselines and the ranking variants below (about 30
# minutes on 2 cores; all 18 variants: EVALUATE_VARIANTS=all, about an hour). One dataset:
#   make evaluate EVALUATE_ARGS="--dataset twitter-hershey" EVALUATE_VARIANTS=design,shipped
EVALUATE_VARIANTS ?= design,design_min_mutual_1,design_adamic_adar,shipped,shipped_blend,shipped_min_mutual_2,shipped_no_popularity,shipped_hop2_sample,shipped_no_fill
EVALUATE_ARGS ?=
evaluate: $(STAMP) ## Recommendation quality on the real graphs vs classic baselines (bench/evaluation/)
	$(BIN)/recs evaluate --out bench/evaluation $(if $(filter all,$(EVALUATE_VARIANTS)),,--variants $(EVALUATE_VARIANTS)) $(EVALUATE_ARGS)

dbt-docs: $(STAMP) ## Generate and serve dbt docs of the newest run on :8081 (lineage to the exposures)
	$(BIN)/recs dbt-docs --serve --port 8081

# Airflow's UI with this repository's DAGs and plugin (the run report): scheduler, DAG processor,
# triggerer and API server in one process group, started in a session of its own so that Ctrl-C
# here, or `make airflow-ui-stop` from another shell, stops every one of them.
AIRFLOW_UI_PORT ?= 8080
UI_PID := $(AIRFLOW_HOME)/standalone.pid
airflow-ui: $(STAMP) $(AIRFLOW_HOME)/airflow.db ## Airflow's UI on :8080 (DAGs start paused); Ctrl-C or `make airflow-ui-stop` stops it
	@$(BIN)/airflow pools set $(DUCKDB_POOL) 1 "one DuckDB writer at a time" > /dev/null
	@echo "Airflow UI on http://localhost:$(AIRFLOW_UI_PORT)/ (log: $(AIRFLOW_HOME)/standalone.log); user admin, its" \
		"password in $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated once started"
	@AIRFLOW__API__PORT=$(AIRFLOW_UI_PORT) setsid $(BIN)/airflow standalone > $(AIRFLOW_HOME)/standalone.log 2>&1 & \
		echo $$! > $(UI_PID); trap '$(MAKE) --no-print-directory airflow-ui-stop; exit 0' INT TERM; \
		wait $$(cat $(UI_PID)); rc=$$?; \
		if [ $$rc -eq 143 ] || [ $$rc -eq 137 ]; then echo "Airflow UI stopped"; exit 0; fi; exit $$rc

airflow-ui-stop: ## Stop the UI `make airflow-ui` started: its whole process group
	@if [ -f $(UI_PID) ]; then pid=$$(cat $(UI_PID)); kill -TERM -- -$$pid 2>/dev/null; \
		for i in $$(seq 30); do kill -0 -- -$$pid 2>/dev/null || break; sleep 1; done; \
		kill -KILL -- -$$pid 2>/dev/null; rm -f $(UI_PID); echo "Airflow UI stopped (process group $$pid)"; \
	else echo "no $(UI_PID): nothing started by make airflow-ui"; fi

clean: ## Remove data/ (live store, runs, published) — keeps .venv
	rm -rf $(RECS_HOME)

# --- the read API (issue 3) ---------------------------------------------------------------------
API_WORKERS ?= 2
.PHONY: serve bench-api

serve: $(STAMP) ## Serve the read API on :8000 (needs RECS_API_JWT_SECRET; `recs token ID` mints)
	$(BIN)/recs serve --workers $(API_WORKERS)

BENCH_API_ARGS ?=
bench-api: $(STAMP) postgres-server ## Read API scenarios (paced reads, dismissals, version switch, soak on SQLite and PostgreSQL): errors, p50/p99/p999
	@command -v wrk >/dev/null 2>&1 || { echo "installing wrk (Debian)"; \
		apt-get install -y -qq wrk >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq wrk; }; }
	$(BIN)/python bench/api.py --workers $(API_WORKERS) $(BENCH_API_ARGS)

# --- the UI tests (issue 12) ------------------------------------------------------------------
# tests/integration/test_operator_view.py drives Debian's chromium headless over the DevTools
# protocol (tests/integration/browser.py); installed here once, like PostgreSQL's binaries.
.PHONY: chromium

chromium: ## Install Debian's chromium if missing (the UI tests drive it headless)
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$RECS_CHROMIUM" ]; then \
		echo "chromium: $$(command -v chromium)$$RECS_CHROMIUM"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	else \
		echo "chromium missing: run 'make chromium' as root, or install Debian's chromium" \
			"package, or set RECS_CHROMIUM" >&2; exit 1; \
	fi

# --- PostgreSQL live store and event ingestion (issue 4) ---------------------------------------
# The tests and bench-ingest run the live store on a real PostgreSQL too: each session starts a
# private throwaway cluster (recs.testing.pgserver: initdb + pg_ctl, as the `postgres` user when
# run as root) from the server binaries of Debian's `postgresql` package, installed here once.
.PHONY: postgres-server bench-ingest

postgres-server: ## Install Debian's PostgreSQL server binaries if missing (tests start their own)
	@if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || [ -n "$$RECS_PG_BINDIR" ]; then \
		echo "PostgreSQL server binaries: $$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)$$RECS_PG_BINDIR"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; \
	else \
		echo "PostgreSQL server binaries missing: run 'make postgres-server' as root, or install" \
			"Debian's postgresql package, or set RECS_PG_BINDIR" >&2; exit 1; \
	fi

BENCH_INGEST_ARGS ?=
bench-ingest: $(STAMP) postgres-server ## Ingest rate and follow/unfollow write latency with vs without a concurrent snapshot, SQLite and PostgreSQL
	$(BIN)/python bench/ingest.py $(BENCH_INGEST_ARGS)

# --- the nightly DAG on Celery workers (issue 15) ---------------------------------------------
# tests/integration/test_celery.py runs the DAG through a real CeleryExecutor: a throwaway Redis
# broker (Debian's redis-server, installed here once), Airflow's metadata DB on a throwaway
# PostgreSQL, the API server, scheduler, DAG processor and two Celery workers.
.PHONY: redis-server test-celery

redis-server: ## Install Debian's Redis server if missing (the Celery test starts its own)
	@if command -v redis-server >/dev/null 2>&1 || [ -n "$$RECS_REDIS_SERVER" ]; then \
		echo "Redis server: $$(command -v redis-server)$$RECS_REDIS_SERVER"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server; \
	else \
		echo "redis-server missing: run 'make redis-server' as root, or install Debian's" \
			"redis-server package, or set RECS_REDIS_SERVER to its path" >&2; exit 1; \
	fi

test-celery: $(STAMP) postgres-server redis-server ## The nightly DAG on two Celery workers vs `airflow dags test` (also in `make test`)
	RECS_REQUIRE_POSTGRES=1 RECS_REQUIRE_REDIS=1 $(BIN)/python -m pytest -q tests/integration/test_celery.py

# --- docker-compose.yml (issue 15) --------------------------------------------------------------
.PHONY: compose-env compose-config

compose-env: ## Write .env with fresh random secrets for docker-compose.yml (never overwrites it)
	$(PYTHON) deploy/compose_env.py .env

compose-config: compose-env ## Validate docker-compose.yml (docker-compose config; needs no engine)
	docker-compose config -q && echo "docker-compose.yml: valid"

# --- bring your own graph (issue 14) -------------------------------------------------------------
# `recs import` into SQLite and a throwaway durable PostgreSQL, from a synthetic export written
# once under /tmp/recs-bench-import; e.g. make bench-import BENCH_IMPORT_ARGS="--users 40000".
.PHONY: bench-import

BENCH_IMPORT_ARGS ?=
bench-import: $(STAMP) postgres-server ## recs import edges rate into SQLite and PostgreSQL (edges/s, CPU, peak RSS) beside each store's floor
	$(BIN)/python bench/imports.py $(BENCH_IMPORT_ARGS)
