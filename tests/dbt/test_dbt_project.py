"""The dbt project itself: it parses with only ``run_dir``, its shard macro is Python's, and its
exclusion reasons are the contract's."""

from __future__ import annotations

import random

import duckdb
import pytest

from recs.config import Settings
from recs.errors import ModelsBuildError
from recs.nightly.models import PROJECT_DIR_ENV, dbt_args, dbt_project_dir, release_duckdb
from recs.nightly.runs import RunPaths
from recs.sharding import shard_of, shard_sql


def test_parse_needs_only_run_dir_and_warns_about_nothing(tmp_path):
    """What `make test` runs: `dbt parse --vars '{run_dir: ...}'` (here with target in tmp).

    Any warning event (a deprecation, an unused config path, a missing var) fails the test.
    """
    from dbt.cli.main import dbtRunner

    warnings = []

    def collect(event):
        if event.info.level in ("warn", "error"):
            warnings.append(event.info.msg)

    project = str(dbt_project_dir())
    outcome = dbtRunner(callbacks=[collect]).invoke([
        "parse", "--project-dir", project, "--profiles-dir", project,
        "--target-path", str(tmp_path / "target"), "--log-path", str(tmp_path / "logs"),
        "--vars", "{run_dir: /tmp/recs-dbt-parse}", "--quiet",
    ])  # fmt: skip
    assert outcome.success, outcome.exception
    assert warnings == []
    manifest = outcome.result
    models = {node.name: node for node in manifest.nodes.values() if node.resource_type == "model"}
    assert {"hub_accounts", "follow_exclusions", "eligible_users", "candidate_profiles",
            "popularity_index"} <= set(models)  # fmt: skip
    for node in models.values():
        assert node.description.startswith("One row per "), node.name
        assert node.columns, node.name
        for column in node.columns.values():
            assert column.description, f"{node.name}.{column.name}"
    for name in ("hub_accounts", "follow_exclusions", "eligible_users", "candidate_profiles",
                 "popularity_index"):  # fmt: skip
        assert models[name].config.contract.enforced, name
    assert {exposure.name for exposure in manifest.exposures.values()} == {
        "two_hop_traversal",
        "read_api",
    }
    assert len(manifest.unit_tests) >= 5


def test_shard_macro_is_shard_sql_and_agrees_with_shard_of(tmp_path):
    """The macro compiles to recs.sharding.shard_sql and computes shard_of on 6,000+ ids.

    Ids: 0..4999, 1,000 random ids below 2**63, and the edges of 32/53/63-bit ranges, for
    shard counts 1, 3, 4, 16, 1000 and 1024.
    """
    from dbt.cli.main import dbtRunner

    paths = RunPaths.create(tmp_path, "2026-11-01", "compile")
    paths.run_dir.mkdir(parents=True)  # compile opens the (empty) warehouse
    counts = (1, 3, 4, 16, 1000, 1024)
    macro_calls = [f"{{{{ shard_id('user_id', {count}) }}}} as shard_{count}" for count in counts]
    python_sql = [f"{shard_sql('user_id', count)} as shard_{count}" for count in counts]
    inline = f"select {', '.join(macro_calls)} from ids"
    try:
        outcome = dbtRunner().invoke(
            dbt_args("compile", paths, Settings(home=tmp_path), "--inline", inline, "--quiet")
        )
    finally:
        release_duckdb()
    assert outcome.success, outcome.exception
    compiled = outcome.result.results[0].node.compiled_code
    assert compiled == f"select {', '.join(python_sql)} from ids"

    rng = random.Random(20240601)
    edges = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**53, 2**53 + 1, 2**63 - 1]
    ids = list(range(5000)) + [rng.randrange(2**63) for _ in range(1000)] + edges
    with duckdb.connect() as con:
        con.execute("create table ids (user_id bigint)")
        con.executemany("insert into ids values (?)", [(user_id,) for user_id in ids])
        got = con.sql(compiled.replace(" from ids", ", user_id from ids")).fetchall()
    assert len(got) == len(ids)
    for row in got:
        user_id = row[-1]
        assert list(row[:-1]) == [shard_of(user_id, count) for count in counts], user_id


def test_project_dir_can_be_overridden(tmp_path, monkeypatch):
    monkeypatch.setenv(PROJECT_DIR_ENV, str(tmp_path))
    with pytest.raises(ModelsBuildError, match=PROJECT_DIR_ENV):
        dbt_project_dir()
    (tmp_path / "dbt_project.yml").write_text("name: x\n")
    assert dbt_project_dir() == tmp_path


def test_every_reason_column_accepts_exactly_the_contracts_exclusion_reasons():
    """A new exclusion reason goes into ``recs.contracts.EXCLUSION_REASONS`` and the dbt model
    that produces it; the ``accepted_values`` test of every ``reason`` column of the project
    (``int_exclusions_unioned``, ``follow_exclusions``) must list the same reasons."""
    import yaml

    from recs.contracts import EXCLUSION_REASONS

    found = {}
    for path in sorted((dbt_project_dir() / "models").rglob("*.yml")):
        for model in (yaml.safe_load(path.read_text()) or {}).get("models", []):
            for column in model.get("columns", []):
                if column["name"] != "reason":
                    continue
                for test in column.get("data_tests", []):
                    if isinstance(test, dict) and "accepted_values" in test:
                        found[model["name"]] = test["accepted_values"]["arguments"]["values"]
    assert set(found) >= {"int_exclusions_unioned", "follow_exclusions"}
    for name, values in found.items():
        assert tuple(values) == EXCLUSION_REASONS, name


EXPOSURE_SOURCES = {
    # the traversal reads its shard's follow edges from the snapshot itself, and the exports
    "two_hop_traversal": ("follow_edges", "users", "in_degrees", "blocks", "mutes"),
    "read_api": ("users", "in_degrees", "user_interests"),
}
"""Snapshot tables each exposure must reach (the design's data flow, ARCHITECTURE §5)."""


def test_docs_describe_everything_and_lineage_runs_from_the_snapshot_to_both_exposures(tmp_path):
    """What `make test` runs after `dbt parse`: `dbt docs generate` (here with an empty catalog,
    in tmp). Its target/manifest.json: every model, source table, exposure and each of their
    columns has a description; walking `depends_on` up from each exposure reaches staging
    models and, through them, the snapshot tables of ``EXPOSURE_SOURCES``, and the two together
    every snapshot table (the lineage dbt docs draws)."""
    import json

    from dbt.cli.main import dbtRunner

    project = str(dbt_project_dir())
    target = tmp_path / "target"
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # docs generate opens the (empty) warehouse
    outcome = dbtRunner().invoke([
        "docs", "generate", "--empty-catalog", "--project-dir", project, "--profiles-dir", project,
        "--target-path", str(target), "--log-path", str(tmp_path / "logs"),
        "--vars", json.dumps({"run_dir": str(run_dir), "snapshot_date": "2026-11-01"}), "--quiet",
    ])  # fmt: skip
    release_duckdb()
    assert outcome.success, outcome.exception
    assert (target / "index.html").is_file() and (target / "catalog.json").is_file()
    manifest = json.loads((target / "manifest.json").read_text())

    models = {k: v for k, v in manifest["nodes"].items() if v["resource_type"] == "model"}
    sources, exposures = manifest["sources"], manifest["exposures"]
    assert len(models) >= 15 and len(sources) >= 6
    assert {e["name"] for e in exposures.values()} == {"two_hop_traversal", "read_api"}
    for unique_id, node in {**models, **sources, **exposures}.items():
        assert node["description"].strip(), f"{unique_id} has no description"
        for column in node.get("columns", {}).values():
            assert column["description"].strip(), f"{unique_id}.{column['name']}"
    for unique_id, node in models.items():
        assert node["columns"], f"{unique_id} documents no column"
    assert all(source["source_name"] == "snapshot" for source in sources.values())

    parents = {**{k: v["depends_on"]["nodes"] for k, v in models.items()},
               **{k: v["depends_on"]["nodes"] for k, v in exposures.items()}}  # fmt: skip

    def upstream(unique_id: str) -> set[str]:
        seen: set[str] = set()
        stack = [unique_id]
        while stack:
            for parent in parents.get(stack.pop(), []):
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return seen

    covered: set[str] = set()
    for unique_id, exposure in exposures.items():
        reached = upstream(unique_id)
        covered |= reached
        for table in EXPOSURE_SOURCES[exposure["name"]]:
            assert f"source.recs.snapshot.{table}" in reached, (exposure["name"], table)
        assert any(node.startswith("model.recs.stg_") for node in reached), exposure["name"]
        assert all(n.startswith(("model.", "source.")) for n in reached), exposure["name"]
    assert set(sources) <= covered, sorted(set(sources) - covered)  # interests: the read API


def test_dbt_writes_under_the_run_even_with_a_relative_home(tmp_path, monkeypatch):
    """RECS_HOME defaults to the relative ./data, and dbt resolves a relative --target-path in
    its project folder: every path given to dbt is absolute, inside the run."""
    import datetime as dt
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    paths = RunPaths(Path("data"), dt.date(2026, 11, 1), "night_1")
    args = dbt_args("docs generate", paths, Settings(home=Path("data")), target="docs")
    run_dir = (tmp_path / "data" / "runs" / "2026-11-01" / "night_1").as_posix()
    assert args[args.index("--target-path") + 1] == f"{run_dir}/dbt/docs"
    assert args[args.index("--log-path") + 1] == f"{run_dir}/dbt/logs"
