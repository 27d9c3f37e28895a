"""``recs import`` against real processes and real data.

- A ``recs import`` process killed with SIGKILL while it writes leaves the store exactly as it
  was (``--replace`` included), and the same command run again loads everything once.
- The same graph imported into SQLite and into PostgreSQL freezes into identical snapshots.
- A bundled real graph, passed to ``recs import`` as a user would pass a file, runs through
  ``recs run`` and publishes.
- A clone of the repository in an empty folder (no ``../shared``) loads the demo graph.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recs.config import Settings
from recs.imports.run import ImportOptions, import_table, parse_options
from recs.imports.sources import open_source
from recs.ingest.reconcile import reconcile_counts
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot
from recs.store.readers import open_reader

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DATASETS = REPO / "datasets"
RECS = [sys.executable, "-c", "import sys; from recs.cli import main; sys.exit(main())"]


def recs_env(home: Path, store_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECS_")}
    env["RECS_HOME"] = str(home)
    if store_url:
        env["RECS_STORE_URL"] = store_url
    return env


def run_recs(env: dict[str, str], cwd: Path, *args: str) -> str:
    """``recs <args>`` in a process of its own; its stdout (the exit status must be 0)."""
    done = subprocess.run(
        [*RECS, *args], env=env, capture_output=True, text=True, cwd=cwd, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def store_rows(settings: Settings) -> dict[str, list[tuple]]:
    with open_reader(settings.live_store_url) as reader:
        return {
            name: reader.read_table(name).sort(pl.all()).rows()
            for name in ("users", "follow_edges")
        }


def test_an_import_killed_while_it_writes_leaves_the_store_as_it_was(store_url, tmp_path):
    """A store holding 3 follows; ``recs import edges big.csv --replace`` (2 M distinct random
    follows) is SIGKILLed when it reports its first million rows written: the store still holds
    the 3 follows, their accounts and counts. The same command again loads all 2 M once."""
    settings = Settings(home=tmp_path / "home", store_url=store_url)
    env = recs_env(settings.home, store_url)
    small = tmp_path / "small.csv"
    small.write_text("follower_id,followee_id\n1,2\n2,3\n3,1\n")
    subprocess.run([*RECS, "import", "edges", str(small)], env=env, check=True, capture_output=True)
    before = store_rows(settings)

    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 400_000 * 400_000, 2_100_000))[:2_000_000]
    rng.shuffle(keys)
    big = tmp_path / "big.csv"
    pl.DataFrame(
        {"follower_id": keys // 400_000, "followee_id": keys % 400_000 + 400_000}
    ).write_csv(big)
    command = [*RECS, "import", "edges", str(big), "--replace"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "rows written" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL, seen
    assert any("follow_edges: 1," in line for line in seen), seen  # killed part-way
    assert store_rows(settings) == before
    assert reconcile_counts(settings)["users_drifted"] == 0

    again = subprocess.run([*command, "--json"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["loaded"] == 2_000_000 and summary["rejected"] == 0
    with open_reader(settings.live_store_url) as reader:
        edges = reader.read_table("follow_edges")
    assert edges.height == 2_000_000
    assert edges.select("follower_id", "followee_id").n_unique() == 2_000_000
    assert reconcile_counts(settings)["users_drifted"] == 0
    assert not list((settings.home / "tmp").glob("import-*"))  # the killed one's area removed


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_the_same_graph_in_sqlite_and_postgresql_gives_the_same_snapshot(postgres_url, tmp_path):
    """twitter-hershey (columns reversed, as the file is followee, follower) with generated
    fields, then extra users, blocks, mutes, dismissals and interests files, into SQLite and
    into PostgreSQL: every snapshot file is byte-for-byte the same (the manifest names the
    store, so it differs)."""
    extra = {
        "users": "user_id,created_at,last_active_at,account_status\n"
        "900001,2021-01-01,2026-10-30,active\n900002,2021-01-02,,suspended\n",
        "blocks": "blocker_id,blocked_id,created_at\n900001,1,2026-10-01\n",
        "mutes": "muter_id,muted_id\n900002,900001\n",
        "dismissals": "user_id,candidate_id,dismissed_at\n900001,2,2026-10-02T03:04:05Z\n",
        "interests": "user_id,tag\n900001,music\n900002,books\n",
    }
    snapshots = {}
    for backend, url in (("sqlite", None), ("postgresql", postgres_url)):
        settings = Settings(home=tmp_path / backend, store_url=url, shard_count=4)
        parse = parse_options(settings)
        source = open_source(
            str(DATASETS / "twitter-followers-hersheycareers.tsv.gz"), batch_rows=1 << 20
        )
        import_table(
            "edges",
            source,
            {"follower_id": "2", "followee_id": "1"},
            settings,
            ImportOptions(generate_missing=True, parse=parse),
        )
        for command, text in extra.items():
            path = tmp_path / f"{backend}-{command}.csv"
            path.write_text(text)
            summary = import_table(
                command,
                open_source(str(path), batch_rows=1024),
                {},
                settings,
                ImportOptions(parse=parse, update_existing=command == "users"),
            )
            assert summary["rejected"] == 0, summary
        paths = RunPaths.create(settings.home, "2026-11-01", "parity")
        freeze_snapshot(paths, settings)
        snapshots[backend] = files_under(paths.snapshot_dir)
    sqlite, postgres = snapshots["sqlite"], snapshots["postgresql"]
    assert set(sqlite) == set(postgres) and len(sqlite) > 6
    differing = {name for name in sqlite if sqlite[name] != postgres[name]}
    assert differing == {"manifest.json"}


def import_then_run(tmp_path: Path, import_args: list[str], snapshot_date: str):
    """``recs import edges <import_args> --json`` then ``recs run --snapshot-date``, as a user
    runs them; returns the import's summary and the published recommendations."""
    home = tmp_path / "home"
    env = recs_env(home, None)
    env["DBT_PROFILES_DIR"] = str(REPO / "dbt_project")

    summary = json.loads(run_recs(env, tmp_path, "import", "edges", *import_args, "--json"))
    run_recs(env, REPO, "run", "--snapshot-date", snapshot_date)
    current = (home / "published" / "CURRENT").read_text().strip()
    published = pl.read_parquet(
        home / "published" / current / "shard_id=*" / "recommendations.parquet",
        hive_partitioning=False,
    )
    return summary, published


def test_a_bundled_real_graph_imported_as_a_user_would_runs_and_publishes(tmp_path):
    """soc-Slashdot0902 straight from datasets/ with --generate-missing (the file has no
    activity times), then ``recs run`` for the demo date: a version is published."""
    summary, published = import_then_run(
        tmp_path,
        [str(DATASETS / "soc-Slashdot0902.txt.gz"), "--generate-missing"],
        "2026-11-01",
    )
    assert summary["loaded"] == 870_161
    assert summary["rejected_by_reason"] == {"self_loop": 78_303}
    assert summary["users_created"] == 82_168
    assert published.height > 100_000


def test_a_real_graph_with_its_own_times_runs_on_its_own_dates(tmp_path):
    """Bitcoin OTC keeps its real rating times (epoch seconds, column 4): the accounts' activity
    comes from them, so a run for the data's last day (2016-01-24) finds eligible users and
    publishes, with nothing generated."""
    summary, published = import_then_run(
        tmp_path,
        [
            str(DATASETS / "soc-sign-bitcoinotc.csv.gz"),
            "--created-at-col",
            "4",
            "--time-format",
            "epoch-s",
        ],
        "2016-01-24",
    )
    assert (summary["loaded"], summary["users_created"], summary["rejected"]) == (35_592, 5_881, 0)
    assert summary["generated"] == []
    assert published["user_id"].n_unique() > 10


def test_a_fresh_clone_with_nothing_beside_it_loads_the_demo_graph(tmp_path):
    """``git clone`` of this repository into an empty folder (so there is no ``../shared``),
    its own code run with this venv's Python (PYTHONPATH=<clone>/include, the venv reuse
    trick): ``recs load-dataset slashdot`` loads the bundled file from the clone, and ``recs
    import`` reads another bundled file by its relative path."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    parent = tmp_path / "empty"
    parent.mkdir()
    clone = parent / "recs"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    assert not (parent / "shared").exists()
    env = recs_env(clone / "data", None)
    env["PYTHONPATH"] = str(clone / "include")
    where = subprocess.run(
        [sys.executable, "-c", "import recs; print(recs.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=clone,
    )
    assert where.stdout.strip().startswith(str(clone / "include"))
    summary = json.loads(run_recs(env, clone, "load-dataset", "slashdot", "--json"))
    assert summary["path"] == str(clone / "datasets" / "soc-Slashdot0902.txt.gz")
    assert summary["users"] == 82_168 and summary["follow_edges"] == 870_161
    bofa = "datasets/twitter-followers-bofa_careers.tsv.gz"  # (followee, follower) columns
    imported = run_recs(
        env,
        clone,
        "import",
        "edges",
        bofa,
        "--follower-col",
        "2",
        "--followee-col",
        "1",
        "--replace",
        "--json",
    )
    assert json.loads(imported)["loaded"] == 68_328
