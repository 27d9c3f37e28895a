"""``recs summary``'s totals (``recs.nightly.reporting.run_summary``) on a hand-made run."""

from __future__ import annotations

import json

from recs.nightly.reporting import run_summary, total_lines
from recs.nightly.runs import RunPaths


def test_totals_are_sums_of_the_shard_manifests_and_rates_say_which_seconds(tmp_path):
    """Three planned shards, shard 2 not computed (no manifest). Eligible users: the plan's 15,
    of which 4 + 6 = 10 in the computed shards (a newcomer read the 10 as the run's). By hand:
    3 + 5 = 8 with lists, 30 + 50 = 80 rows, 1,000 + 3,000 = 4,000 traversals over 1.0 + 3.0 =
    4.0 shard seconds (1,000 a second; the first task also compiled the kernel) and over 0.5 +
    1.5 = 2.0 kernel seconds (2,000 a second, the kernel's own rate that `make bench`
    reports)."""
    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.snapshot_dir.mkdir(parents=True)
    paths.snapshot_manifest.write_text(json.dumps({
        "shard_count": 3, "row_counts": {"users": 12, "follow_edges": 40},
        "shard_plan": {"eligible_users": 15},
    }))  # fmt: skip
    for shard_id, (users, listed, rows, traversals, seconds, kernel) in enumerate(
        [(4, 3, 30, 1_000, 1.0, 0.5), (6, 5, 50, 3_000, 3.0, 1.5)]
    ):
        path = paths.shard_manifest(shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "shard_id": shard_id, "users_in": users, "users_with_recommendations": listed,
            "rows": rows, "traversals": traversals, "seconds": seconds, "kernel_seconds": kernel,
        }))  # fmt: skip
    summary = run_summary(tmp_path, "2026-11-01", "r1")
    assert summary["failed_shards"] == [2]
    assert summary["totals"] == {
        "snapshot_rows": {"users": 12, "follow_edges": 40},
        "shards_done": 2,
        "shard_count": 3,
        "eligible_users": 15,
        "eligible_users_in_computed_shards": 10,
        "users_with_recommendations": 8,
        "recommendation_rows": 80,
        "traversals": 4_000,
        "shard_seconds": 4.0,
        "traversals_per_shard_second": 1_000,
        "traversals_per_kernel_second": 2_000,
        "validation": "not_run",
        "validation_stale": False,
        "stopped_at": None,
        "run_store": None,
        "published": "no",
        "published_detail": "no",
        "in_progress": False,
    }
    # what `recs summary` prints: labels for people, the shards not computed by number
    assert total_lines(summary) == {
        "snapshot users": 12,
        "snapshot follow_edges": 40,
        "shards done": "2 of 3",
        "shards not computed": "002",
        "eligible users": 15,
        "eligible users in computed shards": 10,
        "users with recommendations": 8,
        "recommendation rows": 80,
        "traversals": 4_000,
        "shard seconds (sum)": 4.0,
        "traversals per shard second (compile included)": 1_000,
        "traversals per kernel second (compile excluded)": 2_000,
        "validation": "not run",
        "published": "no",
        "in progress": "no",
    }


def test_with_a_run_store_the_summary_says_what_it_holds(tmp_path, monkeypatch):
    """(From two reviews: a second machine's summary showed the shards a rerun had withdrawn from
    the store; a first version of this line counted markers by name against this machine's
    plan.) This machine holds shards 0 and 1 of 3 and no verdict. The store, in turn: no
    snapshot of the run; shard 0 and the graph complete; shard 1 too; shard 1's marker damaged
    (not trusted); a plan of 4 shards (a rerun elsewhere); an errored verdict. Each line says
    what the store holds and whether this machine's copies differ. A store that cannot be
    listed is named, the local totals still printed."""
    import uuid

    from recs.errors import RunStoreError
    from recs.nightly import artifacts
    from recs.nightly.artifacts import GRAPH, SNAPSHOT, VALIDATION, RunStore, shard_part

    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.snapshot_dir.mkdir(parents=True)
    paths.snapshot_manifest.write_text(json.dumps({"shard_count": 3, "row_counts": {}}))
    for shard_id in (0, 1):
        path = paths.shard_manifest(shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"shard_id": shard_id, "rows": 1, "seconds": 1.0}))
    (paths.graph_dir).mkdir(parents=True)
    (paths.graph_dir / "meta.json").write_text("{}")
    store = RunStore(f"memory://summary-{uuid.uuid4().hex[:12]}/x")
    monkeypatch.setattr(artifacts, "run_store", lambda: store)

    def line():
        summary = run_summary(tmp_path, "2026-11-01", "r1")
        assert summary["totals"]["shards_done"] == 2  # this machine's, whatever the store holds
        return total_lines(summary)["run store"]

    differ = " (this machine's copies above differ: they change as its next stage pulls)"
    assert line() == "holds no snapshot of this run"
    store.push(paths, SNAPSHOT)  # frozen, nothing else yet
    assert line() == "shards done 0 of 3, graph not complete, validation not run" + differ
    for part in (shard_part(0), GRAPH):
        store.push(paths, part)
    assert run_summary(tmp_path, "2026-11-01", "r1")["totals"]["run_store"] == {
        "url": store.url, "shard_count": 3, "shards_done": 1, "graph": True,
        "validation": "not_run",
    }  # fmt: skip
    assert line() == "shards done 1 of 3, graph complete, validation not run" + differ
    store.push(paths, shard_part(1))
    assert line() == "shards done 2 of 3, graph complete, validation not run"
    store.fs.pipe(store.remote(paths, ".parts/shard_id=001.json"), b"garbage{")
    assert line() == "shards done 1 of 3, graph complete, validation not run" + differ
    store.push(paths, shard_part(1))
    store.fs.pipe(store.remote(paths, "snapshot/manifest.json"), b'{"shard_count": 4}')
    assert line() == "shards done 2 of 4, graph complete, validation not run" + differ
    store.fs.pipe(store.remote(paths, "snapshot/manifest.json"), b'{"shard_count": 3}')
    paths.validation_summary.parent.mkdir(parents=True)
    paths.validation_summary.write_text(json.dumps({"outcome": "errored"}))
    store.push(paths, VALIDATION)
    paths.validation_summary.unlink()  # this machine has not pulled it
    assert line() == "shards done 2 of 3, graph complete, validation errored" + differ

    def away(*args):
        raise RunStoreError("run store memory://x: cannot list .parts: injected")

    monkeypatch.setattr(store, "names", away)
    assert line() == "cannot be read: run store memory://x: cannot list .parts: injected"
    monkeypatch.undo()
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    store.fs.pipe(store.remote(paths, "snapshot/manifest.json"), b'{"row_counts": {}}')
    assert line() == (
        "cannot be read: a damaged snapshot manifest or verdict (KeyError: 'settings')"
    )


def test_a_run_another_process_holds_says_so(tmp_path):
    """(From a newcomer, who read a rerun's figures mid-way as its result.) While another
    process holds the run's lock (as `recs run` or a stage does), the summary says the run is
    in progress; once it lets go, that it is not."""
    import subprocess
    import sys

    from test_point_in_time import HOLDER

    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.snapshot_dir.mkdir(parents=True)
    paths.snapshot_manifest.write_text(json.dumps({"shard_count": 1, "row_counts": {}}))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "2026-11-01", "r1"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        summary = run_summary(tmp_path, "2026-11-01", "r1")
        assert summary["totals"]["in_progress"] is True
        assert total_lines(summary)["in progress"] == (
            "yes: another process is working on this run, so these figures may be an earlier "
            "attempt's"
        )
    finally:
        holder.kill()
        holder.wait()
    assert run_summary(tmp_path, "2026-11-01", "r1")["totals"]["in_progress"] is False


def test_a_lock_file_it_may_not_read_makes_in_progress_unknown(tmp_path, monkeypatch):
    """The run's lock file cannot be opened (another user's, mode 600): the summary still
    prints, and says it cannot tell whether the run is in progress."""
    from recs.nightly import reporting

    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.snapshot_dir.mkdir(parents=True)
    paths.snapshot_manifest.write_text(json.dumps({"shard_count": 1, "row_counts": {}}))

    def refused(run_dir):
        raise PermissionError(13, "Permission denied", str(run_dir / ".lock"))

    monkeypatch.setattr(reporting, "in_progress", refused)
    summary = run_summary(tmp_path, "2026-11-01", "r1")
    assert summary["totals"]["in_progress"] is None
    assert total_lines(summary)["in progress"] == "unknown (its lock file cannot be read)"


def test_a_small_rate_keeps_three_significant_digits():
    """(From a newcomer: 15 traversals in 16.597 shard seconds read "0" a second.) By hand:
    15 / 16.597 = 0.90378…, 1 / 3 = 0.333…, 99.94 / 1.0 = 99.94; whole (rounded) from 100 up:
    999 / 1.0 = 999, 9,997 / 10.0 = 999.7 → 1,000 (a review's read "1,000.0"); no seconds, 0."""
    from recs.nightly.reporting import per_second

    assert per_second(15, 16.597) == 0.904
    assert per_second(1, 3.0) == 0.333
    assert per_second(9_994, 100.0) == 99.9
    for count, seconds, rate in ((999, 1.0, 999), (9_997, 10.0, 1_000), (4_000, 4.0, 1_000)):
        assert per_second(count, seconds) == rate
        assert isinstance(per_second(count, seconds), int)
    assert per_second(5, 0.0) == 0
