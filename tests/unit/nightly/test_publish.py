"""Atomic publish (recs.nightly.publish) of runs validated by the real gate.

The runs are test_validation's hand-built run (9 rows, 5 users, 4 shards with 2, 1, 3, 3
rows; docstring there). ``night_1`` is snapshot 2026-11-01, ``night_2`` is 2026-11-02.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import threading

import polars as pl
import pytest
from test_validation import rewrite_shard, write_good_run

import recs.nightly.publish as publish_module
from recs.errors import RunNotFoundError, ValidationFailedError
from recs.nightly.publish import publish_run, set_current
from recs.nightly.validation import validate_run
from recs.published import current_version, list_versions
from recs.testing.published import recommendations_for

DAY_1 = dt.date(2026, 11, 1)
DAY_2 = dt.date(2026, 11, 2)


def validated_run(home, run_id, snapshot_date=DAY_1, **kwargs):
    paths, settings = write_good_run(home, run_id=run_id, snapshot_date=snapshot_date, **kwargs)
    validate_run(paths, settings)
    return paths, settings


def entries(folder):
    """Every path under ``folder``, relative, sorted (hidden names included)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_publish_writes_a_complete_version_and_points_current(tmp_path):
    """Manifest by hand: 9 rows, 5 users, shard rows 2, 1, 3, 3; files hard-linked."""
    paths, settings = validated_run(tmp_path / "home", "night_1")
    result = publish_run(paths, settings)

    published = settings.published_dir
    assert result["previous"] is None and result["current"] is True
    assert result["replaced"] == "new"
    assert (published / "CURRENT").read_text() == "night_1\n"
    assert entries(published / "night_1") == [
        "candidate_profiles.parquet",
        "manifest.json",
        "popularity_index.parquet",
        "shard_id=000",
        "shard_id=000/recommendations.parquet",
        "shard_id=001",
        "shard_id=001/recommendations.parquet",
        "shard_id=002",
        "shard_id=002/recommendations.parquet",
        "shard_id=003",
        "shard_id=003/recommendations.parquet",
    ]
    manifest = json.loads((published / "night_1" / "manifest.json").read_text())
    assert manifest["run_id"] == "night_1"
    assert manifest["snapshot_date"] == "2026-11-01"
    assert manifest["generated_at"] == "2026-11-02T00:00:00"
    assert (manifest["shard_count"], manifest["rows"], manifest["users"]) == (4, 9, 5)
    assert [s["rows"] for s in manifest["shards"]] == [2, 1, 3, 3]
    assert manifest["settings"]["top_k"] == 3
    # how the lists were ranked, not only their caps (a hand-kept list had left these out)
    assert {name: manifest["settings"][name] for name in ("ranking", "popularity_weight",
            "hop1_order", "hop2_order", "hub_damping", "popularity_per_tag")} == {
        "ranking": settings.ranking, "popularity_weight": settings.popularity_weight,
        "hop1_order": settings.hop1_order, "hop2_order": settings.hop2_order,
        "hub_damping": settings.hub_damping, "popularity_per_tag": settings.popularity_per_tag,
    }  # fmt: skip
    # where the run lives, how its tasks are cut and what only the read API uses (with its own
    # values) are not what the run computed
    assert not {"home", "datasets_dir", "graph_partitions_per_task", "fill_short_lists",
                "cold_start_min_following"} & set(manifest["settings"])  # fmt: skip
    linked = published / "night_1" / "shard_id=002" / "recommendations.parquet"
    assert linked.stat().st_ino == paths.shard_output(2).stat().st_ino
    # only the lock file and CURRENT besides the version: no staging left behind
    assert sorted(p.name for p in published.iterdir()) == [
        ".history.jsonl",
        ".lock",
        "CURRENT",
        "night_1",
    ]


def test_publish_refuses_an_unvalidated_run(tmp_path):
    paths, settings = write_good_run(tmp_path / "home", run_id="night_1")
    with pytest.raises(ValidationFailedError, match="has not been validated"):
        publish_run(paths, settings)
    assert current_version(settings.published_dir) is None
    assert list_versions(settings.published_dir) == []


def test_poisoned_run_is_refused_and_current_stays_on_the_previous_version(tmp_path):
    """night_2 recommends user 6 to himself: the gate fails, publish refuses, night_1 serves."""
    home = tmp_path / "home"
    good, settings = validated_run(home, "night_1")
    publish_run(good, settings)

    poisoned, _ = write_good_run(home, run_id="night_2", snapshot_date=DAY_2)
    rewrite_shard(
        poisoned,
        0,
        lambda f: f.with_columns(
            pl.when(pl.col("rank") == 2)
            .then(6)
            .otherwise(pl.col("candidate_id"))
            .alias("candidate_id")
        ),
    )
    with pytest.raises(ValidationFailedError, match="no_self_recommendation"):
        validate_run(poisoned, settings)
    with pytest.raises(ValidationFailedError, match=r"validation failed \(no_self_recommendation"):
        publish_run(poisoned, settings)

    assert current_version(settings.published_dir) == "night_1"
    assert [v["run_id"] for v in list_versions(settings.published_dir)] == ["night_1"]
    assert not (settings.published_dir / "night_2").exists()
    assert recommendations_for(settings.published_dir, 6)["run_id"].unique().to_list() == [
        "night_1"
    ]


def test_publish_refuses_a_shard_changed_after_validation(tmp_path):
    paths, settings = validated_run(tmp_path / "home", "night_1")
    rewrite_shard(paths, 0, lambda f: f.with_columns(pl.col("score") * 0.5))
    with pytest.raises(ValidationFailedError, match="shard 0 changed since it was validated"):
        publish_run(paths, settings)
    assert current_version(settings.published_dir) is None
    assert sorted(p.name for p in settings.published_dir.iterdir()) == [".lock"]


def test_publish_refuses_a_summary_of_another_run(tmp_path):
    paths, settings = validated_run(tmp_path / "home", "night_1")
    summary_path = paths.validation_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "run_id": "night_0"}))
    with pytest.raises(ValidationFailedError, match="is for run 'night_0'"):
        publish_run(paths, settings)


def test_rerun_of_publish_is_idempotent(tmp_path):
    """Same run, same files: the version folder is left untouched, bytes identical."""
    paths, settings = validated_run(tmp_path / "home", "night_1")
    publish_run(paths, settings)
    version = settings.published_dir / "night_1"
    before = (entries(version), (version / "manifest.json").read_bytes(), version.stat().st_ino)

    again = publish_run(paths, settings)
    assert again["replaced"] == "unchanged" and again["previous"] == "night_1"
    after = (entries(version), (version / "manifest.json").read_bytes(), version.stat().st_ino)
    assert after == before
    assert (settings.published_dir / "CURRENT").read_text() == "night_1\n"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two_renames"])
def test_rerun_with_new_output_replaces_only_its_own_version(tmp_path, monkeypatch, exchange):
    """night_1 is recomputed with halved scores after night_2 was published: night_1's folder
    gets the new files, night_2's stays byte for byte, and CURRENT stays on night_2 (later
    snapshot)."""
    if not exchange:
        monkeypatch.setattr(publish_module, "_exchange", lambda first, second: False)
    home = tmp_path / "home"
    night_1, settings = validated_run(home, "night_1")
    publish_run(night_1, settings)
    night_2, _ = validated_run(home, "night_2", snapshot_date=DAY_2)
    publish_run(night_2, settings)
    night_2_manifest = (settings.published_dir / "night_2" / "manifest.json").read_bytes()

    rewrite_shard(night_1, 0, lambda f: f.with_columns(pl.col("score") * 0.5))
    validate_run(night_1, settings)
    result = publish_run(night_1, settings)

    assert result["replaced"] == "replaced" and result["current"] is False
    assert current_version(settings.published_dir) == "night_2"
    assert (settings.published_dir / "night_2" / "manifest.json").read_bytes() == night_2_manifest
    scores = recommendations_for(settings.published_dir, 6, version="night_1")["score"].to_list()
    assert scores == [0.45, 0.25]
    assert sorted(p.name for p in settings.published_dir.iterdir()) == [
        ".history.jsonl",
        ".lock",
        "CURRENT",
        "night_1",
        "night_2",
    ]


def test_set_current_rolls_back_to_a_complete_version_only(tmp_path):
    home = tmp_path / "home"
    night_1, settings = validated_run(home, "night_1")
    publish_run(night_1, settings)
    night_2, _ = validated_run(home, "night_2", snapshot_date=DAY_2)
    assert publish_run(night_2, settings)["previous"] == "night_1"

    assert set_current(settings, "night_1") == {"run_id": "night_1", "previous": "night_2"}
    assert [(v["run_id"], v["is_current"]) for v in list_versions(settings.published_dir)] == [
        ("night_1", True),
        ("night_2", False),
    ]
    assert set_current(home, "night_2")["run_id"] == "night_2"  # a RECS_HOME path works too

    with pytest.raises(RunNotFoundError, match="no published version 'night_9'"):
        set_current(settings, "night_9")
    (settings.published_dir / "night_1" / "shard_id=003" / "recommendations.parquet").unlink()
    with pytest.raises(RunNotFoundError, match="incomplete"):
        set_current(settings, "night_1")
    assert current_version(settings.published_dir) == "night_2"


def test_crash_while_staging_leaves_no_visible_partial_version(tmp_path, monkeypatch):
    """The third file fails to link: no night_2 folder, CURRENT on night_1, staging removed.
    A staging folder left by a killed process is hidden from readers and reused."""
    home = tmp_path / "home"
    night_1, settings = validated_run(home, "night_1")
    publish_run(night_1, settings)
    night_2, _ = validated_run(home, "night_2", snapshot_date=DAY_2)

    real_link_or_copy = publish_module.link_or_copy
    calls = []

    def failing_link_or_copy(source, target, **options):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(errno.EIO, "disk on fire")
        real_link_or_copy(source, target, **options)

    monkeypatch.setattr(publish_module, "link_or_copy", failing_link_or_copy)
    with pytest.raises(OSError, match="disk on fire"):
        publish_run(night_2, settings)
    published = settings.published_dir
    assert sorted(p.name for p in published.iterdir()) == [
        ".history.jsonl",
        ".lock",
        "CURRENT",
        "night_1",
    ]
    assert current_version(published) == "night_1"

    leftover = published / ".night_2.staging" / "shard_id=000"
    leftover.mkdir(parents=True)  # as if the process had been killed mid-way
    assert [v["run_id"] for v in list_versions(published)] == ["night_1"]
    monkeypatch.setattr(publish_module, "link_or_copy", real_link_or_copy)
    assert publish_run(night_2, settings)["current"] is True
    assert sorted(p.name for p in published.iterdir()) == [
        ".history.jsonl",
        ".lock",
        "CURRENT",
        "night_1",
        "night_2",
    ]


def test_copies_when_hard_links_are_impossible(tmp_path, monkeypatch):
    paths, settings = validated_run(tmp_path / "home", "night_1")

    def no_links(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(publish_module.os, "link", no_links)
    publish_run(paths, settings)
    copied = settings.published_dir / "night_1" / "shard_id=000" / "recommendations.parquet"
    assert copied.stat().st_ino != paths.shard_output(0).stat().st_ino
    assert copied.read_bytes() == paths.shard_output(0).read_bytes()


def test_current_swap_is_atomic_for_concurrent_readers(tmp_path):
    """While CURRENT flips between night_1 and night_2 200 times, every read of CURRENT is a
    whole version name and every list read through it comes from that one version."""
    home = tmp_path / "home"
    night_1, settings = validated_run(home, "night_1")
    publish_run(night_1, settings)
    night_2, _ = validated_run(home, "night_2", snapshot_date=DAY_2)
    publish_run(night_2, settings)
    published = settings.published_dir
    stop = threading.Event()
    seen: list[tuple[str | None, list[str]]] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                name = current_version(published)
                runs = recommendations_for(published, 2, version=name)["run_id"].to_list()
                seen.append((name, runs))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            set_current(settings, "night_1" if i % 2 else "night_2")
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert seen
    assert {name for name, _ in seen} <= {"night_1", "night_2"}
    assert all(runs == [name] * 3 for name, runs in seen)
    assert not any(p.name.endswith(".tmp") for p in published.iterdir())


def test_republished_manifest_is_byte_identical(tmp_path, monkeypatch):
    """The manifest holds no publish time: a republish in another 'day' writes the same bytes."""
    paths, settings = validated_run(tmp_path / "home", "night_1")
    publish_run(paths, settings)
    first = (settings.published_dir / "night_1" / "manifest.json").read_bytes()
    (settings.published_dir / "night_1" / "manifest.json").unlink()  # force a fresh write
    os.utime(paths.shard_output(0), (0, 0))
    # a copy without its manifest is not this run's files as validated (the gate saw nothing
    # published): the publish refuses until the run is validated again
    with pytest.raises(ValidationFailedError, match="validated against nothing"):
        publish_run(paths, settings)
    (settings.published_dir / "night_1" / "manifest.json").write_bytes(first)
    # staged afresh and compared byte for byte with the copy in place (``_move_into_place``)
    assert publish_run(paths, settings)["replaced"] == "unchanged"
    assert (settings.published_dir / "night_1" / "manifest.json").read_bytes() == first


def test_a_publisher_that_waits_for_the_lock_says_who_holds_it(tmp_path, caplog):
    """(From a review: publish and rollback waited silently.) Another process holds
    ``published/.lock``: a second publisher logs one warning naming the lock and the holder's
    pid before it waits, and gets the lock once the holder lets go."""
    import subprocess
    import sys

    published = tmp_path / "published"
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; from pathlib import Path; "
            "from recs.nightly.publish import publisher_lock\n"
            f"with publisher_lock(Path({str(published)!r})):\n"
            "    print('held', flush=True); sys.stdin.read()"
        )],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        entered = threading.Event()

        def publish() -> None:
            with publish_module.publisher_lock(published):
                entered.set()

        with caplog.at_level("WARNING", logger=publish_module.log.name):
            waiting = threading.Thread(target=publish)
            waiting.start()
            assert not entered.wait(1.0)  # it waits
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == [
            f"waiting for {published / '.lock'}: another publish, rollback or gc holds it "
            f"(pid {holder.pid})"
        ]
        holder.stdin.close()
        assert entered.wait(30)
        waiting.join()
    finally:
        holder.kill()
        holder.wait()
    assert (published / ".lock").read_text() == f"{os.getpid()}\n"


def test_a_moved_home_publishes_under_its_new_path(tmp_path):
    """A run frozen under one home, whose home was then moved (or mounted at another path on
    another worker): validate and publish go to the home the run is found under, not the one
    frozen into its settings (they published into the old path, which no longer held it), and
    the gate's input fingerprints do not change with the home's path."""
    import shutil

    from recs.nightly import pipeline, shard_gate
    from recs.nightly.runs import RunPaths

    paths, settings = write_good_run(tmp_path / "old", run_id="night_1")
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    before = [shard_gate.inputs_fingerprint(paths, pipeline.run_settings(paths), i) for i in (0, 1)]
    shutil.move(tmp_path / "old", tmp_path / "new")
    moved = RunPaths.find(tmp_path / "new", DAY_1, "night_1")
    assert pipeline.run_settings(moved).home == tmp_path / "new"
    # the gate's saved shard results still match: the home is not what a shard's checks read
    assert before == [
        shard_gate.inputs_fingerprint(moved, pipeline.run_settings(moved), i) for i in (0, 1)
    ]
    assert pipeline.run_settings(moved).hop1_cap == settings.hop1_cap  # the rest stays frozen
    pipeline.validate_run(moved)
    assert pipeline.publish_run(moved)["current"] is True
    assert current_version(tmp_path / "new" / "published") == "night_1"
    assert not (tmp_path / "old").exists()

