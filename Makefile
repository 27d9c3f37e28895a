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

.PHONY: help venv demo test test-fast lint bench bench-scale evaluate dbt-docs clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

venv: $(STAMP) ## Create .venv and install the pinned requirements (first use only)

$(AIRFLOW_HOME)/airflow.db: $(STAMP)
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/db-migrate.log 2>&1 || (tail -20 $(AIRFLOW_HOME)/db-migrate.log; exit 1)

demo: $(STAMP) $(AIRFLOW_HOME)/airflow.db ## Load soc-Slashdot0902, run the nightly DAG for DEMO_DATE, show results
	$(BIN)/recs load-dataset slashdot --replace
	$(BIN)/airflow pools set $(DUCKDB_POOL) 1 "one DuckDB writer at a time" > /dev/null
	@echo "running the DAG recs_who_to_follow_nightly for $(DEMO_DATE) (log: $(RECS_HOME)/demo-dag.log) ..."
	@$(BIN)/airflow dags test recs_who_to_follow_nightly $(DEMO_DATE) > $(RECS_HOME)/demo-dag.log 2>&1 \
		|| (tail -60 $(RECS_HOME)/demo-dag.log; exit 1)
	@$(BIN)/airflow tasks states-for-dag-run recs_who_to_follow_nightly $(DEMO_DATE) -o json 2>/dev/null \
		| $(BIN)/python bench/stage_times.py
	$(BIN)/recs runs
	$(BIN)/recs summary --snapshot-date $(DEMO_DATE)
	@for u in $(DEMO_USERS); do $(BIN)/recs recommend $$u; done

# ruff; the architecture's import contracts (import-linter, pyproject.toml); sqlfluff on the dbt
# project (its .sqlfluff says why the jinja templater).
define lint_steps
	$(BIN)/ruff check dags plugins include tests bench
	$(BIN)/lint-imports
	cd dbt_project && $(BIN)/sqlfluff lint models tests macros
endef

test: $(STAMP) postgres-server ## Install everything, then lint, dbt parse and run every test (what CI runs)
	$(lint_steps)
	cd dbt_project && $(BIN)/dbt parse --quiet --vars '{run_dir: /tmp/recs-dbt-parse}'
	RECS_REQUIRE_POSTGRES=1 $(BIN)/python -m pytest -q tests

test-fast: $(STAMP) ## Unit and DAG tests only (skips slow real-data tests)
	$(BIN)/python -m pytest -q -m "not slow" tests

lint: $(STAMP) ## ruff, the import contracts (lint-imports) and sqlfluff on the dbt project
	$(lint_steps)

# Both benchmarks use their own RECS_HOME under /tmp (never data/); e.g.
#   make bench BENCH_ARGS="--users 1000000 --shards 16"    make bench-scale SCALE_ARGS="--reuse-store"
bench: $(STAMP) ## Traversal benchmark: ours vs pure Python vs DuckDB SQL, side by side
	$(BIN)/python bench/traversal.py $(BENCH_ARGS)

bench-scale: $(STAMP) ## 1 M users / 50 M edges through every nightly stage: time and memory
	$(BIN)/python bench/scale_run.py $(SCALE_ARGS)

# Issue 13: the four real graphs, every ranking variant and baseline (about an hour; one dataset:
#   make evaluate EVALUATE_ARGS="--dataset twitter-hershey --variants design,shipped").
EVALUATE_ARGS ?=
evaluate: $(STAMP) ## Recommendation quality on the real graphs vs classic baselines (bench/evaluation/)
	$(BIN)/recs evaluate --out bench/evaluation $(EVALUATE_ARGS)

dbt-docs: $(STAMP) ## Generate and serve dbt docs for the latest run (lineage to the exposures)
	cd dbt_project && $(BIN)/dbt docs generate --vars "{run_dir: $$(ls -d $(RECS_HOME)/runs/*/* | tail -1)}" && $(BIN)/dbt docs serve --port 8081

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
