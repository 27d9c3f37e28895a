"""``recs validate``, ``publish``, ``rollback``, ``runs``/``runs show`` and ``gc`` on hand-built
runs (test_validation's: 4 shards, 9 rows, 5 users, 8 eligible), through ``recs.cli.main``.

Each outcome of the gate exits with its own code and one line ``recs: error: …``: 3 the data
failed, 4 the gate itself errored, 5 nothing to validate, 6 a failed shard with nothing to carry
it over from; 2 for an unknown version.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
from test_validation import write_good_run

from recs import cli
from recs.config import get_settings
from recs.nightly import history
from recs.nightly.publish import publish_run, rollback
from recs.nightly.validation import validate_run
from recs.published import check_version, current_version


@pytest.fixture
def recs(tmp_path, monkeypatch, capsys):
    """``recs(*args) -> (exit code, stdout, stderr lines)`` with RECS_HOME = tmp_path/home."""
    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    for name in ("RUN_RETENTION_DAYS", "SNAPSHOT_RETENTION_DAYS", "PUBLISHED_RETENTION_VERSIONS"):
        monkeypatch.delenv(f"RECS_{name}", raising=False)
    get_settings.cache_clear()

    def run(*args: str):
        get_settings.cache_clear()
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err.splitlines()

    yield run
    get_settings.cache_clear()


def one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("recs: error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(lines), lines
    return errors[0]


def night(home, day: int, **kwargs):
    """Run ``night_<day>`` of 2026-11-<day> written under ``home`` with its frozen settings
    (the CLI reads a run's settings back from its snapshot manifest)."""
    paths, settings = write_good_run(
        home, run_id=f"night_{day}", snapshot_date=dt.date(2026, 11, day), **kwargs
    )
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    return paths, settings


def test_validate_exits_by_outcome(recs, tmp_path, monkeypatch):
    home = tmp_path / "home"
    night(home, 1)
    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0

    night(home, 2, rows={})  # computed, empty, while 8 users are eligible
    code, _, err = recs("validate", "--snapshot-date", "2026-11-02")
    assert code == 3 and "rows_at_least_one" in one_error(err)

    night(home, 3, rows={}, eligible=[])  # nobody eligible
    code, _, err = recs("validate", "--snapshot-date", "2026-11-03")
    assert code == 5 and "nobody is eligible tonight" in one_error(err)

    import great_expectations as gx

    def raising(self, *args, **kwargs):
        raise RuntimeError("injected checkpoint failure")

    monkeypatch.setattr(gx.Checkpoint, "run", raising)
    paths, _ = night(home, 4)
    code, _, err = recs("validate", "--snapshot-date", "2026-11-04")
    assert code == 4 and "injected checkpoint failure" in one_error(err)
    assert (paths.validation_dir / "results.json").is_file()
    # and a publish of that run refuses with the same class and code
    code, _, err = recs("publish", "--snapshot-date", "2026-11-04")
    assert code == 4 and "refusing to publish run night_4: validation errored" in one_error(err)


def test_publish_carry_over_and_runs_show(recs, tmp_path):
    home = tmp_path / "home"
    night(home, 1)
    paths, _ = night(home, 2)
    paths.shard_manifest(1).unlink()  # shard 1 failed
    assert recs("validate", "--snapshot-date", "2026-11-02")[0] == 0
    code, _, err = recs("publish", "--snapshot-date", "2026-11-02")
    assert code == 6
    assert "shard(s) 001 failed and nothing is published" in one_error(err)

    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0
    code, out, _ = recs("publish", "--snapshot-date", "2026-11-01")
    assert code == 0 and "CURRENT before" in out and "none" in out and "new" in out
    code, out, _ = recs("publish", "--snapshot-date", "2026-11-01")
    assert code == 0 and "published again, the same files" in out and "night_1" in out
    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0  # the same shard bytes
    code, out, _ = recs("publish", "--snapshot-date", "2026-11-01")  # a new verdict: replaced
    assert code == 0 and (  # (a newcomer read "its files replaced" of identical shards)
        "published again, replacing the version (its manifest or files differ: a new verdict, "
        "a shard rerun)" in " ".join(w for w in out.split() if w != "│")  # the cell's lines
    )
    code, _, err = recs("validate", "--snapshot-date", "2026-11-02")
    warning = "recs: warning: shards 001 have no output of this run (failed, or never run): "
    assert code == 0 and err == [  # (a newcomer published a half-run night unwarned)
        warning + "a publish carries them over from CURRENT; `recs shard run --shard N` "
        "computes one first"]  # fmt: skip
    code, out, err = recs("publish", "--snapshot-date", "2026-11-02", "--json")
    assert code == 0
    assert json.loads(out)["carried_over"] == [{"shard_id": 1, "carried_from": "night_1"}]
    assert len(err) == 1 and err[0].startswith(warning + "carried over from CURRENT; ")

    code, out, _ = recs("runs")
    assert code == 0 and "001 (night_1)" in out
    code, out, _ = recs("runs", "show", "night_2")
    assert code == 0
    assert "carried over" in out and "rollback target" in out
    shard_lines = [line for line in out.splitlines() if "001" in line]
    assert any("carried over" in line and "night_1" in line for line in shard_lines)
    code, out, _ = recs("runs", "show", "night_2", "--json")
    document = json.loads(out)
    assert document["is_current"] is True and document["predecessor"] == "night_1"
    code, out, _ = recs("runs", "--json", "show", "night_2")  # (a newcomer's: ignored)
    assert code == 0 and json.loads(out) == document
    code, _, err = recs("runs", "show", "night_9")
    assert code == 2 and "no published version 'night_9'" in one_error(err)


def test_recs_runs_warns_of_a_current_naming_no_published_version(recs, tmp_path):
    """(From a newcomer.) A CURRENT damaged from outside, or naming a version that is not
    published, is a warning line of ``recs runs`` and ``runs show`` (and ``current_problem``
    in the JSON), not a listing that quietly marks nothing current."""
    home = tmp_path / "home"
    paths, settings = night(home, 1)
    validate_run(paths, settings)
    publish_run(paths, settings)
    code, _, err = recs("runs", "--json")
    assert code == 0 and not any("warning" in line for line in err)
    current = settings.published_dir / "CURRENT"
    for text, says in (("", "names no version"), ("bogus\n", "names 'bogus', which is not")):
        current.write_text(text)
        code, out, err = recs("runs", "--json")
        assert code == 0 and says in json.loads(out)["current_problem"]
        (warning,) = [line for line in err if line.startswith("recs: warning: ")]
        assert says in warning
        code, out, err = recs("runs", "show", "night_1")
        assert code == 0 and "no (CURRENT unusable: see the warning above)" in out
        assert any(line.startswith("recs: warning: ") and says in line for line in err)
    current.write_text("night_1\n")
    (settings.published_dir / "night_1" / "shard_id=002" / "recommendations.parquet").unlink()
    code, out, err = recs("runs", "--json")  # a version whose files are not all there
    assert code == 0 and "CURRENT names night_1, which is damaged" in json.loads(out)[
        "current_problem"]  # fmt: skip


def test_rollback_command(recs, tmp_path):
    home = tmp_path / "home"
    for day in (1, 2):
        paths, settings = night(home, day)
        validate_run(paths, settings)
        publish_run(paths, settings)
    code, out, _ = recs("rollback")
    assert code == 0 and "CURRENT: night_1 (was night_2)" in out
    code, _, err = recs("rollback")
    assert code == 2 and "night_1 replaced no version when it was published" in one_error(err)
    code, _, err = recs("rollback", "--to", "night_7")
    assert code == 2 and "cannot roll back to night_7" in one_error(err)
    code, _, err = recs("rollback", "--to", "../night_2")
    assert code == 2 and "invalid run id" in one_error(err)
    assert current_version(home / "published") == "night_1"
    code, out, _ = recs("rollback", "--to", "night_2", "--json")
    assert json.loads(out) == {"run_id": "night_2", "previous": "night_1", "changed": True}
    (home / "published" / "CURRENT").write_text("")  # damaged from outside, then mended
    code, out, _ = recs("rollback", "--to", "night_1")
    assert code == 0 and "CURRENT: night_1 (was none)" in out  # (a newcomer: "was None")


def age(path, day: dt.date) -> None:
    """Set the modification time of ``path`` and everything directly in it to ``day``."""
    stamp = dt.datetime.combine(day, dt.time(12), dt.UTC).timestamp()
    for entry in [path, *path.iterdir()]:
        os.utime(entry, (stamp, stamp))


def test_gc_applies_retention_and_keeps_current_and_its_predecessor(recs, tmp_path, monkeypatch):
    """night_1..4 published, then rolled back to night_2. Keeping 2 versions by recency
    keeps night_2 (rolled back to, last used) and night_4, plus night_1, night_2's predecessor
    (the rollback target); night_3 goes. Runs (aged to their dates) older than 14 days before
    2026-12-01 go, except the runs of CURRENT and its predecessor and one changed lately;
    snapshot folders older than 30 days go, unless frozen lately (2026-10-20, as `make demo`'s
    is: a newcomer's gc right after the demo listed its snapshot); names that are not dates
    stay."""
    home = tmp_path / "home"
    for day in (1, 2, 3, 4):
        paths, settings = night(home, day)
        validate_run(paths, settings)
        publish_run(paths, settings)
    rollback(settings, to="night_2")
    for day in (1, 2, 3, 4):
        age(home / "runs" / f"2026-11-0{day}" / f"night_{day}", dt.date(2026, 11, day))
    recent = home / "runs" / "2026-11-05" / "backfill"
    recent.mkdir(parents=True)
    age(recent, dt.date(2026, 11, 30))  # an old date, worked on yesterday: kept
    for name in ("2026-10-01", "2026-10-20", "2026-11-15", "notes"):
        (home / "snapshots" / name).mkdir(parents=True)
        for file in ("manifest.json", "users.parquet"):
            (home / "snapshots" / name / file).write_text("{}")
        (home / "snapshots" / f".{name}.lock").touch()  # as every freeze leaves
    for name in ("2026-10-01", "2026-11-15"):
        age(home / "snapshots" / name, dt.date.fromisoformat(name))
    monkeypatch.setenv("RECS_PUBLISHED_RETENTION_VERSIONS", "2")

    code, out, err = recs("gc", "--dry-run", "--today", "2026-12-01")
    expected = [
        "published/night_3",
        "runs/2026-11-03/night_3",
        "runs/2026-11-04/night_4",
        "snapshots/2026-10-01",
    ]
    assert code == 0
    assert out.splitlines() == [f"would remove {item}" for item in expected]
    assert (home / "published" / "night_3").is_dir() and (
        home / "snapshots" / "2026-10-01"
    ).is_dir()

    code, out, err = recs("gc", "--today", "2026-12-01", "--json")
    document = json.loads(out)
    assert document["kept"] == {"current": "night_2", "predecessor": "night_1"}
    assert [f"{k}/{n}" for k, names in document["removed"].items() for n in names] == expected
    published = home / "published"
    assert sorted(p.name for p in published.iterdir() if not p.name.startswith(".")) == [
        "CURRENT",
        "night_1",
        "night_2",
        "night_4",
    ]
    for name in ("night_1", "night_2", "night_4"):
        check_version(published, name)
    assert sorted(p.name for p in (home / "runs").iterdir()) == [
        "2026-11-01",
        "2026-11-02",
        "2026-11-05",
    ]
    snapshots = home / "snapshots"
    kept = [".2026-10-20.lock", ".2026-11-15.lock", ".notes.lock", "2026-10-20", "2026-11-15",
            "notes"]  # fmt: skip
    assert sorted(p.name for p in snapshots.iterdir()) == kept
    assert recs("gc", "--today", "2026-12-01")[1] == ""  # nothing left to remove
    age(snapshots / "2026-10-20", dt.date(2026, 10, 31))  # written before the cut-off: it goes
    (snapshots / "2026-10-20" / "manifest.json").unlink()  # the folder's own time is now
    (snapshots / "2026-10-20" / "old.parquet").symlink_to("users.parquet")  # judged by its own
    os.utime(snapshots / "2026-10-20" / "old.parquet", (1e9, 1e9), follow_symlinks=False)
    (snapshots / "2026-10-20" / "users.parquet").touch()  # what it points at: written today
    assert recs("gc", "--today", "2026-12-01")[1] == ""  # users.parquet is recent: kept
    age(snapshots / "2026-10-20", dt.date(2026, 10, 31))
    assert recs("gc", "--today", "2026-12-01")[1] == "removed snapshots/2026-10-20\n"
    assert sorted(p.name for p in snapshots.iterdir()) == kept[1:3] + kept[4:]
    code, _, err = recs("gc", "--today", "2026-13-01")
    assert code == 2 and "invalid --today date '2026-13-01': no such day" in one_error(err)
    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).date().isoformat()
    (home / "snapshots" / "2026-11-16").mkdir()  # 15 days before 2026-12-01: not old yet
    for when in (tomorrow, "2027-12-01"):  # a mistyped year would count every folder old
        code, out, err = recs("gc", "--today", when)
        assert code == 2 and out == ""
        assert one_error(err).startswith(f"recs: error: invalid --today date '{when}': later than")
    assert (home / "snapshots" / "2026-11-16").is_dir()
    code, _, err = recs("gc", "--dry-run", "--today", "0001-01-05")  # (a second review's)
    assert code == 2 and "too early to count the retention days back from" in one_error(err)
    code, out, _ = recs("gc", "--today", "2027-12-01", "--dry-run")  # a preview: allowed
    assert code == 0 and "would remove snapshots/2026-11-16" in out.splitlines()
    assert (home / "snapshots" / "2026-11-16").is_dir()


@pytest.mark.parametrize("damage", ["", '{"run_id": "night_2", "shards"', "[1, 2]"])
def test_a_damaged_manifest_is_one_line_and_gc_keeps_its_run(recs, tmp_path, damage):
    """CURRENT's manifest truncated to nothing, cut mid-object, or valid JSON of another shape:
    each command that reads it says which file is damaged in one line (no traceback); `runs`
    lists the versions it can read; gc still applies retention and keeps CURRENT's run, whose
    date the damaged manifest no longer tells."""
    home = tmp_path / "home"
    for day in (1, 2):
        paths, settings = night(home, day)
        validate_run(paths, settings)
        publish_run(paths, settings)
    (home / "published" / "night_2" / "manifest.json").write_text(damage)
    for args in (["runs", "show", "night_2"], ["rollback", "--to", "night_2"]):
        code, _, err = recs(*args)
        assert code == 2 and "night_2" in one_error(err) and "is damaged" in one_error(err)
    code, out, _ = recs("runs")
    assert code == 0 and "night_1" in out
    for day in (1, 2):
        age(home / "runs" / f"2026-11-0{day}" / f"night_{day}", dt.date(2026, 11, day))
    code, out, err = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
    assert code == 0, err
    # night_1, the predecessor, is kept by date; night_2 by name alone: its date is unreadable
    assert json.loads(out)["removed"]["runs"] == []


def test_gc_keeps_the_snapshot_of_a_date_being_backfilled(recs, tmp_path):
    """A backfill of 2026-10-01 (older than the 30-day snapshot retention) is running, in
    another process holding its run's lock: gc leaves that date's retained snapshot, which a
    rerun of the backfill would need; once the process is gone, gc removes it."""
    import subprocess
    import sys

    from test_point_in_time import HOLDER

    home = tmp_path / "home"
    (home / "snapshots" / "2026-10-01").mkdir(parents=True)
    age(home / "snapshots" / "2026-10-01", dt.date(2026, 10, 1))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(home), "2026-10-01", "backfill"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, _ = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
        assert code == 0 and json.loads(out)["removed"]["snapshots"] == []
    finally:
        holder.kill()
        holder.wait()
    code, out, _ = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-01"]


def test_gc_removes_old_snapshots_with_their_date_locks_unless_a_freeze_holds_one(
    recs, tmp_path, caplog
):
    """Under snapshots/ (30-day retention, today 2026-12-01, so dates before 2026-11-01 go):
    2026-10-01 retained with its lock file; 2026-10-02 a lock file only (a refused freeze);
    2026-10-03 retained, its lock held by a freeze now; 2026-11-20 recent; `.notes.lock` not a
    date. gc --dry-run lists 2026-10-01 only (what gc would do now: it leaves a held date; a
    review's dry run listed it) and removes nothing; gc removes 2026-10-01 with its lock and
    2026-10-02's lock, and keeps 2026-10-03 (not listed) until the freeze lets go, when a dry
    run lists it; the recent and the undated files stay."""
    import fcntl

    root = tmp_path / "home" / "snapshots"
    for name in ("2026-10-01", "2026-10-03", "2026-11-20"):
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text("{}")
        age(root / name, dt.date.fromisoformat(name))
    for name in ("2026-10-01", "2026-10-02", "2026-10-03", "2026-11-20", "notes"):
        (root / f".{name}.lock").touch()

    def names():
        return sorted(p.name for p in root.iterdir())

    before = names()
    with (root / ".2026-10-03.lock").open("a") as freezing:
        fcntl.flock(freezing.fileno(), fcntl.LOCK_EX)
        code, out, _ = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
        assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-01"]
        assert names() == before
        code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
        assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-01"]
        assert "left snapshots/2026-10-03: a run of that date holds its lock" in caplog.text
        assert names() == [
            ".2026-10-03.lock", ".2026-11-20.lock", ".notes.lock", "2026-10-03", "2026-11-20"
        ]
    code, out, _ = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-03"]
    code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-03"]
    assert names() == [".2026-11-20.lock", ".notes.lock", "2026-11-20"]


def test_a_snapshot_removal_cut_short_leaves_no_half_snapshot_and_the_next_gc_ends_it(
    recs, tmp_path, monkeypatch, caplog
):
    """(From a review.) The deletion of 2026-10-01's files fails part-way: gc says so and goes
    on, and no half-deleted folder is left under the date's name for a run to reuse (it was
    renamed aside first); the next gc removes what is left, whatever the date's retention is
    by then (a second review's)."""
    import shutil

    root = tmp_path / "home" / "snapshots"
    (root / "2026-10-01").mkdir(parents=True)
    for name in ("manifest.json", "users.parquet"):
        (root / "2026-10-01" / name).write_text("{}")
    (root / ".2026-10-01.lock").touch()
    age(root / "2026-10-01", dt.date(2026, 10, 1))
    deleting = shutil.rmtree

    def cut_short(path, *args, **kwargs):
        (Path(path) / "users.parquet").unlink()
        raise OSError(f"injected: {Path(path).name} half removed")

    monkeypatch.setattr(shutil, "rmtree", cut_short)
    code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == []
    assert "left snapshots/2026-10-01: injected: .2026-10-01." in caplog.text
    left = sorted(p.name for p in root.iterdir())
    assert left[0].endswith(".gc") and left[1:] == [".2026-10-01.lock"]
    monkeypatch.setattr(shutil, "rmtree", deleting)
    monkeypatch.setenv("RECS_SNAPSHOT_RETENTION_DAYS", "90")  # the date is no longer old
    caplog.set_level("INFO", logger="recs.nightly.retention")
    code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == []
    assert [p.name for p in root.iterdir()] == [".2026-10-01.lock"]  # the leftover went
    assert "finished removing snapshots/.2026-10-01." in caplog.text


def test_run_and_version_removals_cut_short_leave_no_half_folder_and_the_next_gc_ends_them(
    recs, tmp_path, monkeypatch, caplog
):
    """(From a review.) night_1..4 published (keeping 2 versions by recency: night_1 and
    night_2 go; night_3 is CURRENT's predecessor) and night_1's run aged past run retention.
    The deletion
    of each folder fails part-way: no half-deleted run or version is left under its name, and
    the next gc removes what was left aside, although the run and version it was are no longer
    listed (on de50639 a version's leftover `.night_1.gc` stayed for good, and a run's half
    stayed under its name, its folder time moved by the deletions: recent to the next gc)."""
    import shutil

    home = tmp_path / "home"
    for day in (1, 2, 3, 4):
        paths, settings = night(home, day)
        validate_run(paths, settings)
        publish_run(paths, settings)
    age(home / "runs" / "2026-11-01" / "night_1", dt.date(2026, 11, 1))
    monkeypatch.setenv("RECS_PUBLISHED_RETENTION_VERSIONS", "2")
    caplog.set_level("INFO", logger="recs.nightly.retention")
    deleting = shutil.rmtree

    def cut_short(path, *args, **kwargs):
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        if not files:
            return deleting(path, *args, **kwargs)
        files[0].unlink()
        raise OSError(f"injected: {Path(path).name} half removed")

    monkeypatch.setattr(shutil, "rmtree", cut_short)
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code != 0 and "injected: .night_1." in one_error(err)
    monkeypatch.setattr(shutil, "rmtree", deleting)
    published = sorted(p.name for p in (home / "published").iterdir() if p.is_dir())
    assert published[0].startswith(".night_1.") and published[0].endswith(".gc")
    assert published[1:] == ["night_2", "night_3", "night_4"]
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"] == {
        "published": ["night_2"], "runs": ["2026-11-01/night_1"], "run_store": [], "snapshots": []
    }  # fmt: skip
    assert sorted(p.name for p in (home / "published").iterdir() if p.is_dir()) == [
        "night_3", "night_4"
    ]  # fmt: skip
    assert not (home / "runs" / "2026-11-01").exists()
    assert "finished removing published/.night_1." in caplog.text

    monkeypatch.setattr(shutil, "rmtree", cut_short)  # the run's own removal cut short
    age(home / "runs" / "2026-11-02" / "night_2", dt.date(2026, 11, 2))
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code != 0 and "injected: .night_2." in one_error(err)
    monkeypatch.setattr(shutil, "rmtree", deleting)
    left = [p.name for p in (home / "runs" / "2026-11-02").iterdir()]
    assert len(left) == 1 and left[0].startswith(".night_2.") and left[0].endswith(".gc")
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code == 0 and json.loads(out)["removed"]["runs"] == []
    assert not (home / "runs" / "2026-11-02").exists()


def test_two_gcs_at_once_leave_each_others_removals_alone(recs, tmp_path, monkeypatch):
    """(From a review.) gc A is deleting night_1's old run (renamed aside) when gc B, another
    process, starts: B must leave the folder A is deleting (on 4147162 B swept it and A died of
    FileNotFoundError, exit 74, before pruning the snapshots), and A ends its removal."""
    import shutil
    import subprocess
    import sys

    import recs as package

    home = tmp_path / "home"
    night(home, 1)
    age(home / "runs" / "2026-11-01" / "night_1", dt.date(2026, 11, 1))
    deleting, second = shutil.rmtree, []

    def while_another_gc_runs(path, *args, **kwargs):
        if Path(path).name.startswith(".night_1.") and not second:
            environment = {**os.environ, "PYTHONPATH": str(Path(package.__file__).parents[1])}
            second.append(subprocess.run(
                [sys.executable, "-m", "recs.cli", "gc", "--today", "2026-11-20", "--json"],
                capture_output=True, text=True, env=environment, timeout=120,
            ))  # fmt: skip
            assert Path(path).is_dir()  # B left it
        return deleting(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", while_another_gc_runs)
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"]["runs"] == ["2026-11-01/night_1"]
    assert second[0].returncode == 0, second[0].stderr
    assert json.loads(second[0].stdout)["removed"]["runs"] == []
    assert not (home / "runs" / "2026-11-01").exists()


def test_a_gc_whose_date_folder_another_gc_removed_goes_on(recs, tmp_path, monkeypatch):
    """(From a second review.) gc A has listed runs/2026-11-01/night_1 when gc B, another
    process, removes the run and its date folder: A skips them and goes on to the snapshots
    (on 8290ac8 it died of FileNotFoundError on the vanished date folder, exit 74)."""
    import subprocess
    import sys

    import recs as package
    from recs.nightly import retention

    home = tmp_path / "home"
    night(home, 1)
    age(home / "runs" / "2026-11-01" / "night_1", dt.date(2026, 11, 1))
    (home / "snapshots" / "2026-10-01").mkdir(parents=True)
    (home / "snapshots" / "2026-10-01" / "manifest.json").write_text("{}")
    age(home / "snapshots" / "2026-10-01", dt.date(2026, 10, 1))
    probe, second = retention.in_progress, []

    def after_another_gc(run_dir):
        if not second:
            environment = {**os.environ, "PYTHONPATH": str(Path(package.__file__).parents[1])}
            second.append(subprocess.run(
                [sys.executable, "-m", "recs.cli", "gc", "--today", "2026-11-20", "--json"],
                capture_output=True, text=True, env=environment, timeout=120,
            ))  # fmt: skip
        return probe(run_dir)

    monkeypatch.setattr(retention, "in_progress", after_another_gc)
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert second[0].returncode == 0, second[0].stderr
    assert json.loads(second[0].stdout)["removed"]["runs"] == ["2026-11-01/night_1"]
    assert code == 0, err
    assert json.loads(out)["removed"] == {
        "published": [], "runs": [], "run_store": [], "snapshots": []
    }  # fmt: skip
    assert not (home / "runs" / "2026-11-01").exists()
    assert not (home / "snapshots" / "2026-10-01").exists()  # B's; A reached them too


def test_gc_leaves_a_run_folder_that_is_a_link(recs, tmp_path):
    """(From a second review.) runs/2026-11-01/night_9 is an operator's link to a folder
    elsewhere, both old: gc leaves the link and what it points at (on 8290ac8 it renamed the
    link aside, rmtree refused it, gc exited 74, and the link stayed hidden for good)."""
    home = tmp_path / "home"
    elsewhere = tmp_path / "archive" / "night_9"
    elsewhere.mkdir(parents=True)
    (elsewhere / "manifest.json").write_text("{}")
    age(elsewhere, dt.date(2026, 11, 1))
    (home / "runs" / "2026-11-01").mkdir(parents=True)
    link = home / "runs" / "2026-11-01" / "night_9"
    link.symlink_to(elsewhere)
    stamp = dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC).timestamp()
    os.utime(link, (stamp, stamp), follow_symlinks=False)  # the link old too
    code, out, err = recs("gc", "--today", "2026-11-20", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"]["runs"] == []
    assert (home / "runs" / "2026-11-01" / "night_9").is_symlink()
    assert (elsewhere / "manifest.json").is_file()


def test_gc_judges_links_in_a_run_by_their_own_time(recs, tmp_path):
    """(A second review's.) An old run holding a dangling link is removed: gc read the time of
    what the link points at and stopped, exit 74, before the snapshots."""
    run = tmp_path / "home" / "runs" / "2026-09-01" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / "dangling").symlink_to(tmp_path / "nowhere")
    stamp = dt.datetime(2026, 9, 1, 12, tzinfo=dt.UTC).timestamp()
    for entry in (run, run / "manifest.json", run / "dangling"):
        os.utime(entry, (stamp, stamp), follow_symlinks=False)
    code, out, err = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"]["runs"] == ["2026-09-01/r1"] and not run.exists()


def test_gc_goes_on_past_a_snapshot_it_cannot_remove(recs, tmp_path, caplog):
    """(From reviews.) 2026-10-01's lock path is a folder, 2026-10-04's a named pipe (gc hung
    opening it): gc says so in a warning and removes 2026-10-02 all the same (it stopped at the
    first before); a second remover of 2026-10-02 finds nothing to report (two gc's at once
    listed it twice). A dry run lists what gc removes, no more (it listed 2026-10-01)."""
    from recs.nightly import snapshot_removal

    root = tmp_path / "home" / "snapshots"
    for name in ("2026-10-01", "2026-10-02", "2026-10-04"):
        (root / name).mkdir(parents=True)
        age(root / name, dt.date.fromisoformat(name))
    (root / ".2026-10-01.lock").mkdir()
    os.mkfifo(root / ".2026-10-04.lock")
    elsewhere = tmp_path / "other disk" / "2026-10-03"
    elsewhere.mkdir(parents=True)
    age(elsewhere, dt.date(2026, 10, 3))
    (root / "2026-10-03").symlink_to(elsewhere)  # an operator's: left, and said (a 2nd review)
    lock_is_not_a_file = "[Errno 22] not a regular file, as a lock file is"
    code, out, _ = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-02"]
    assert f"would leave snapshots/2026-10-01: {lock_is_not_a_file}" in caplog.text
    assert f"would leave snapshots/2026-10-04: {lock_is_not_a_file}" in caplog.text
    code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["snapshots"] == ["2026-10-02"]
    assert f"left snapshots/2026-10-01: {lock_is_not_a_file}" in caplog.text
    assert f"left snapshots/2026-10-04: {lock_is_not_a_file}" in caplog.text
    assert f"left snapshots/2026-10-03: {root / '2026-10-03'} is a symbolic link" in caplog.text
    assert f"would leave snapshots/2026-10-03: {root / '2026-10-03'} is a symbolic" in caplog.text
    assert sorted(p.name for p in root.iterdir()) == [
        ".2026-10-01.lock", ".2026-10-04.lock", "2026-10-01", "2026-10-03", "2026-10-04"
    ]
    assert elsewhere.is_dir()
    assert snapshot_removal.remove(tmp_path / "home", "2026-10-02") == snapshot_removal.NO_FOLDER


def test_discarding_snapshots_skips_a_date_gc_removed_meanwhile(tmp_path):
    """(From a review.) A store replaced (``discard_all``) waits on 2026-10-01's lock while gc
    holds it; gc removes the folder and the lock. The discard then has nothing to move aside
    for that date (it raised FileNotFoundError) and discards the other."""
    import fcntl
    import threading

    from recs.nightly import retained

    home = tmp_path / "home"
    for name in ("2026-10-01", "2026-10-02"):
        (home / "snapshots" / name).mkdir(parents=True)
        (home / "snapshots" / name / "manifest.json").write_text("{}")
    found = []
    lock = home / "snapshots" / ".2026-10-01.lock"
    with lock.open("a") as gc_handle:
        fcntl.flock(gc_handle.fileno(), fcntl.LOCK_EX)
        discard = threading.Thread(target=lambda: found.append(retained.discard_all(home)))
        discard.start()
        discard.join(0.3)
        assert discard.is_alive()  # waiting on gc's lock
        for path in (home / "snapshots" / "2026-10-01").iterdir():
            path.unlink()
        (home / "snapshots" / "2026-10-01").rmdir()
        lock.unlink()
    discard.join(10)
    assert found == [["2026-10-02"]]
    assert not (home / "snapshots" / "2026-10-02").exists()


def test_gc_dry_run_and_a_refused_rollback_make_nothing(recs, tmp_path, monkeypatch):
    """(A newcomer's: run from another folder, they each left ./data/published/.lock.) On a
    home with nothing in it, `gc --dry-run` and `gc` say nothing is published and where they
    looked, a rollback is refused with one line, and no file or folder is made."""
    home = tmp_path / "home"  # the recs fixture's RECS_HOME, not made yet
    for command in (("gc", "--dry-run"), ("gc",)):
        code, out, err = recs(*command)
        assert code == 0 and out == ""
        assert f"nothing published: no {home / 'published'} (is RECS_HOME right?)" in err[-1]
    for command in (("rollback",), ("rollback", "--to", "night_1")):
        code, _, err = recs(*command)
        assert code == 2 and "nothing is published under" in one_error(err)
    assert not home.exists()
    _store_on(monkeypatch, (tmp_path / "store").as_uri())  # a home missing is a typo still
    try:
        code, out, err = recs("gc", "--dry-run")
        assert code == 0 and err[-1].endswith("(is RECS_HOME right?)"), err
    finally:
        get_settings.cache_clear()


def test_a_date_lock_whose_file_never_stays_gives_up_with_one_line(tmp_path, monkeypatch):
    """(A review's open item: the retry had no bound.) A filesystem that reports another file at
    the lock's path every time: after LOCK_ATTEMPTS locks, an OSError saying so, not a loop."""
    from recs.nightly import retained

    looks = []

    def never(handle, path):
        looks.append(path)
        return False

    monkeypatch.setattr(retained, "still_at", never)
    with pytest.raises(OSError, match=r"cannot hold the lock .*\.2026-10-01\.lock: .*100 times"):
        with retained._date_lock(tmp_path / "snapshots" / "2026-10-01"):
            pytest.fail("the lock was taken")
    assert len(looks) == retained.LOCK_ATTEMPTS == 100


def test_a_freeze_waiting_on_a_date_lock_gc_removes_takes_the_new_one(tmp_path):
    """A freeze waits on snapshots/.2026-10-01.lock while gc holds it; gc deletes the file and
    lets go (as ``snapshot_removal.remove`` does). The freeze must then hold the lock of the file at
    that path, so that the next freeze of the date waits for it: a non-blocking lock on the
    path fails while the freeze is inside, and succeeds once it is out."""
    import fcntl
    import threading

    from recs.nightly.retained import _date_lock

    target = tmp_path / "snapshots" / "2026-10-01"
    lock = tmp_path / "snapshots" / ".2026-10-01.lock"
    lock.parent.mkdir()
    inside, leave = threading.Event(), threading.Event()

    def freeze():
        with _date_lock(target):
            inside.set()
            leave.wait(10)

    with lock.open("a") as gc_handle:
        fcntl.flock(gc_handle.fileno(), fcntl.LOCK_EX)
        freezer = threading.Thread(target=freeze)
        freezer.start()
        assert not inside.wait(0.3)  # waiting on gc's lock
        lock.unlink()
    try:
        assert inside.wait(10)
        with lock.open("a") as next_freeze:
            with pytest.raises(BlockingIOError):
                fcntl.flock(next_freeze.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        leave.set()
        freezer.join(10)
    with lock.open("a") as next_freeze:
        fcntl.flock(next_freeze.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_runs_reading_a_date_share_its_lock_and_a_freeze_waits_for_them(tmp_path):
    """Two runs hold snapshots/2026-10-01 for reading at once (``retained.reading``, in threads:
    flock locks belong to each open file, as they would to two processes); a freeze of the date
    (``_date_lock``) waits until both let go, and gc's non-blocking take fails meanwhile."""
    import fcntl
    import threading

    from recs.nightly import retained

    target = tmp_path / "snapshots" / "2026-10-01"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text("{}")
    both, leave, frozen = threading.Barrier(3), threading.Event(), threading.Event()
    seen = []

    def read():
        with retained.reading(target) as whole:
            seen.append(whole)
            both.wait(10)
            leave.wait(10)

    def freeze():
        with retained._date_lock(target):
            frozen.set()

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    both.wait(10)  # both inside at once
    assert seen == [True, True]
    freezer = threading.Thread(target=freeze)
    freezer.start()
    assert not frozen.wait(0.3)
    with (tmp_path / "snapshots" / ".2026-10-01.lock").open("a") as gc_handle:
        with pytest.raises(BlockingIOError):
            fcntl.flock(gc_handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    leave.set()
    assert frozen.wait(10)
    for thread in (*readers, freezer):
        thread.join(10)


def test_gc_prunes_the_run_store_by_the_rules_of_local_runs(recs, tmp_path, monkeypatch):
    """With a run store (a shared folder): night_1..4 published, rolled back to night_2, each
    night's snapshot pushed, its objects in the store dated its night; a run of an old date that
    only another machine ran, dated then too; one of an old date pushed yesterday (a backfill
    elsewhere); one with only a damaged marker, dated its old date. gc --dry-run lists night_3,
    night_4, the other machine's old run and the damaged one and removes nothing; gc removes
    them, markers and files, keeps CURRENT's and its predecessor's runs and the backfill; a
    second gc has nothing left to remove."""
    from recs.nightly import artifacts
    from recs.nightly.artifacts import SNAPSHOT, RunStore
    from recs.nightly.runs import RunPaths

    home = tmp_path / "home"
    url = (tmp_path / "run store").as_uri()
    store = RunStore(url)

    def pushed(paths, day: dt.date) -> None:
        if not paths.snapshot_manifest.exists():
            paths.snapshot_manifest.parent.mkdir(parents=True)
            paths.snapshot_manifest.write_text("{}")
        store.push(paths, SNAPSHOT)
        dated(tmp_path / "run store" / "runs" / paths.snapshot_date.isoformat() / paths.run_id,
              day)  # fmt: skip

    def dated(folder, day: dt.date) -> None:  # the store's objects as uploaded that day
        stamp = dt.datetime.combine(day, dt.time(12), dt.UTC).timestamp()
        for path in folder.rglob("*"):
            os.utime(path, (stamp, stamp))

    for day in (1, 2, 3, 4):
        paths, settings = night(home, day)
        validate_run(paths, settings)
        publish_run(paths, settings)
        pushed(paths, dt.date(2026, 11, day))
    rollback(settings, to="night_2")
    pushed(RunPaths.create(tmp_path / "other", dt.date(2026, 11, 5), "elsewhere"),
           dt.date(2026, 11, 5))  # fmt: skip
    pushed(RunPaths.create(tmp_path / "other", dt.date(2026, 11, 6), "backfill"),
           dt.date(2026, 11, 30))  # fmt: skip
    damaged = tmp_path / "run store" / "runs" / "2026-11-07" / "broken" / ".parts"
    damaged.mkdir(parents=True)
    (damaged / "snapshot.json").write_text('{"format": 1, "files": ')
    dated(damaged.parent, dt.date(2026, 11, 7))
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    artifacts._open.cache_clear()

    def in_store() -> list[str]:
        return [f"{date}/{run_id}" for date, run_id in store.runs()]

    everything = in_store()
    assert len(everything) == 7
    expected = ["runs/2026-11-03/night_3", "runs/2026-11-04/night_4",
                "runs/2026-11-05/elsewhere", "runs/2026-11-07/broken"]  # fmt: skip
    code, out, err = recs("gc", "--dry-run", "--today", "2026-12-01", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"]["run_store"] == expected and in_store() == everything
    code, out, err = recs("gc", "--today", "2026-12-01")
    assert code == 0, err
    assert [line for line in out.splitlines() if "run_store" in line] == [
        f"removed run_store/{name}" for name in expected
    ]
    assert in_store() == ["2026-11-01/night_1", "2026-11-02/night_2", "2026-11-06/backfill"]
    assert not (tmp_path / "run store" / "runs" / "2026-11-03" / "night_3").exists()
    night_2 = RunPaths.create(tmp_path / "fresh", dt.date(2026, 11, 2), "night_2")
    assert store.marker(night_2, SNAPSHOT) is not None  # what is kept is whole
    code, out, _ = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0 and json.loads(out)["removed"]["run_store"] == []
    artifacts._open.cache_clear()


def test_a_gate_that_cannot_see_published_errors_instead_of_skipping(tmp_path, monkeypatch):
    """Run store set. Machine a publishes night_1: the store records CURRENT. night_2's gate on
    machine b, whose RECS_HOME has no published/, must not skip the change checks as on a first
    night (a vacuous pass): it errors, naming night_1 and the folder. On machine a, which sees
    published/, the same night passes and is compared with night_1. Without a run store, b's
    gate is a first night (nothing recorded anywhere)."""
    from recs.errors import ValidationEngineError
    from recs.nightly import artifacts

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    try:
        paths, settings = night(tmp_path / "a", 1)
        validate_run(paths, settings)
        publish_run(paths, settings)
        assert artifacts.RunStore(url).current() == "night_1"
        paths_b, settings_b = night(tmp_path / "b", 2)
        with pytest.raises(ValidationEngineError, match="records CURRENT = night_1") as raised:
            validate_run(paths_b, settings_b)
        assert str(tmp_path / "b" / "published") in str(raised.value)
        paths_a, settings_a = night(tmp_path / "a", 2)
        assert validate_run(paths_a, settings_a)["compared_with"] == "night_1"
        monkeypatch.delenv("RECS_RUN_STORE_URL")
        get_settings.cache_clear()
        assert validate_run(paths_b, settings_b)["compared_with"] is None
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_publishing_or_moving_current_where_published_is_not_served_is_refused(
    tmp_path, monkeypatch
):
    """(From a review.) Run store set. Machine a publishes night_1 and validates night_2. The
    same night_2 on machine b (no published/), with a's verdict, is not published there: a
    RunStoreError names night_1 and b's folder, b's published/ gets no version and no
    CURRENT, and the store still records night_1. a publishes night_2; c gets a copy of a's
    published/, then a rolls back to night_1. c's copy is stale (it names night_2): neither
    set_current nor a rollback moves its CURRENT, and the store keeps night_1."""
    import shutil

    from recs.errors import RunStoreError
    from recs.nightly import artifacts
    from recs.nightly.publish import set_current

    url = (tmp_path / "store").as_uri()
    _store_on(monkeypatch, url)
    try:
        paths_a2, settings_a2 = _night_1_published_night_2_validated(tmp_path / "a")
        paths_b2, settings_b2 = night(tmp_path / "b", 2)
        shutil.copytree(paths_a2.validation_dir, paths_b2.validation_dir, dirs_exist_ok=True)
        with pytest.raises(RunStoreError, match="records CURRENT = night_1") as raised:
            publish_run(paths_b2, settings_b2)
        assert str(raised.value).endswith(f"{tmp_path / 'b' / 'published'} here has no CURRENT")
        assert sorted(p.name for p in (tmp_path / "b" / "published").iterdir()) == [".lock"]
        assert artifacts.RunStore(url).current() == "night_1"

        publish_run(paths_a2, settings_a2)
        shutil.copytree(tmp_path / "a" / "published", tmp_path / "c" / "published")
        assert rollback(tmp_path / "a", "night_1")["changed"] is True
        assert artifacts.RunStore(url).current() == "night_1"
        stale = f"records CURRENT = night_1 while {tmp_path / 'c' / 'published'} here names night_2"
        with pytest.raises(RunStoreError, match="run set_current where published/ is") as raised:
            set_current(tmp_path / "c", "night_1")
        assert stale in str(raised.value)
        with pytest.raises(RunStoreError, match="run recs rollback where published/ is") as raised:
            rollback(tmp_path / "c")
        assert str(raised.value).endswith(
            f"{stale}; only if this is the served published/ and the store's record is the "
            "wrong one (its RECS_RUN_STORE_URL was changed), `recs rollback --to night_2` here "
            "records night_2 (on a stale copy it would misdirect the served machine)"
        )
        (tmp_path / "c" / "published" / "CURRENT").write_text("night_9\n")  # no such version
        with pytest.raises(RunStoreError, match="run recs rollback where published/ is") as raised:
            rollback(tmp_path / "c", "night_1")
        assert str(raised.value).endswith("here names night_9")  # no remedy naming it (review)
        (tmp_path / "c" / "published" / "CURRENT").write_text("night_2\n")
        assert current_version(tmp_path / "c" / "published") == "night_2"
        assert artifacts.RunStore(url).current() == "night_1"
        assert current_version(tmp_path / "a" / "published") == "night_1"
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_a_gate_where_published_is_not_served_is_refused_before_it_pushes(tmp_path, monkeypatch):
    """(From a newcomer: `recs validate` on a second machine, with no published/, pushed an
    "errored" verdict over the run store's pass, and the first machine's publish then failed.)
    Machine a publishes night_1 (the store records it) and validates night_2; on machine b the
    gate of night_2 is refused at once, naming b's folder: the store keeps a's verdict and b
    writes none."""
    from recs.errors import ValidationEngineError
    from recs.nightly import artifacts, pipeline
    from recs.nightly.artifacts import SNAPSHOT, VALIDATION
    from recs.nightly.runs import RunPaths

    url = (tmp_path / "store").as_uri()
    _store_on(monkeypatch, url)
    try:
        paths_a2, settings_a2 = _night_1_published_night_2_validated(tmp_path / "a")
        store = artifacts.RunStore(url)
        store.push(paths_a2, SNAPSHOT)
        store.push(paths_a2, VALIDATION)
        passed = store.read(paths_a2, "validation/summary.json")
        paths_b2 = RunPaths.create(tmp_path / "b", "2026-11-02", "night_2")
        with pytest.raises(ValidationEngineError, match="run validate_run where published/ is"):
            pipeline.validate_run(paths_b2)
        assert store.read(paths_a2, "validation/summary.json") == passed
        assert store.marker(paths_a2, VALIDATION) is not None
        assert not paths_b2.validation_summary.exists()
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def _night_1_published_night_2_validated(home):
    """Machine ``home``: night_1 validated and published, night_2 validated; night_2's."""
    paths_1, settings_1 = night(home, 1)
    validate_run(paths_1, settings_1)
    publish_run(paths_1, settings_1)
    paths_2, settings_2 = night(home, 2)
    validate_run(paths_2, settings_2)
    return paths_2, settings_2


def _store_on(monkeypatch, url: str) -> None:
    from recs.nightly import artifacts

    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()


def test_gc_on_a_worker_that_does_not_see_published_leaves_the_store_runs(
    recs, tmp_path, monkeypatch
):
    """(From a review.) Machine a publishes night_1 with the run store set; the store records
    CURRENT = night_1. recs gc a month later on machine b (RECS_HOME = tmp_path/home, no
    published/) cannot tell which runs back the served version: it removes none of the
    store's runs, though night_1 is past the retention."""
    from recs.nightly.artifacts import SNAPSHOT, RunStore

    url = (tmp_path / "store").as_uri()
    _store_on(monkeypatch, url)
    store = RunStore(url)
    paths, settings = night(tmp_path / "a", 1)
    validate_run(paths, settings)
    publish_run(paths, settings)
    for path in [*paths.snapshot_dir.rglob("*")]:
        os.utime(path, (1_762_000_000, 1_762_000_000))  # 2025-11-01: long past
    store.push(paths, SNAPSHOT)
    for path in (tmp_path / "store" / "runs").rglob("*"):
        os.utime(path, (1_762_000_000, 1_762_000_000))
    assert store.current() == "night_1"
    code, out, err = recs("gc", "--today", "2026-12-01", "--json")
    assert code == 0, err
    assert json.loads(out)["removed"]["run_store"] == []
    assert store.runs() == [("2026-11-01", "night_1")]
    (tmp_path / "home" / "runs").mkdir(parents=True)  # a worker's home, where its runs are
    code, out, err = recs("gc", "--today", "2026-12-01")  # not "is RECS_HOME right?" (newcomer)
    assert (code, err[-1]) == (0, (
        "removed 0 folder(s), ages counted from 2026-12-01; kept nothing published on this "
        f"machine (no {tmp_path / 'home' / 'published'}): the versions are pruned by `recs gc` "
        "where published/ is"
    ))  # fmt: skip


def test_gc_while_another_machine_uploads_keeps_the_upload(recs, tmp_path, monkeypatch):
    """(From a review.) A backfill of an old date on another machine is uploading its snapshot,
    its first push (no marker yet): gc here meanwhile keeps it (the store's objects are new),
    and once the upload ends the part pulls whole on a third machine. A file removed from the
    store behind a marker is uploaded again by the next push of the part."""
    import threading

    from recs.nightly.artifacts import SNAPSHOT, RunStore
    from recs.nightly.runs import RunPaths

    url = (tmp_path / "store").as_uri()
    store = RunStore(url)
    other = RunPaths.create(tmp_path / "other", dt.date(2026, 11, 5), "backfill")
    other.snapshot_dir.mkdir(parents=True)
    other.snapshot_manifest.write_text("{}")
    (other.snapshot_dir / "users.parquet").write_bytes(b"u" * 100)
    uploading, go_on = threading.Event(), threading.Event()
    real_put = store.fs.put

    def slow_put(local, remote, *args, **kwargs):
        real_put(local[:1], remote[:1], *args, **kwargs)  # the first file is up
        uploading.set()
        go_on.wait(10)
        real_put(local[1:], remote[1:], *args, **kwargs)

    monkeypatch.setattr(store.fs, "put", slow_put)
    errors = []

    def push():
        try:
            store.push(other, SNAPSHOT)
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    pusher = threading.Thread(target=push)
    pusher.start()
    try:
        assert uploading.wait(10)
        _store_on(monkeypatch, url)
        code, out, err = recs("gc", "--today", "2026-12-01", "--json")
    finally:
        go_on.set()
        pusher.join(30)
    assert not errors and code == 0, (errors, err)
    assert json.loads(out)["removed"]["run_store"] == []
    fresh = RunPaths.create(tmp_path / "fresh", dt.date(2026, 11, 5), "backfill")
    assert store.pull(fresh, SNAPSHOT)["files"] == 2
    users = tmp_path / "store" / "runs" / "2026-11-05" / "backfill" / "snapshot" / "users.parquet"
    users.unlink()  # gone behind the marker
    assert store.push(other, SNAPSHOT)["uploaded"] == 1 and users.read_bytes() == b"u" * 100


def test_the_store_records_each_switch_before_it_is_made(tmp_path, monkeypatch):
    """(From a review.) A switch the run store cannot record is not made: publish_run raises
    and CURRENT stays as it was, so the record is never behind CURRENT. A gate whose local
    published/ names a stale version (machine b published night_1 before the store was set,
    the publish host a then published night_2) errors instead of comparing with night_1.
    ``recs rollback --to`` the current version records it (a store set up after the last
    publish)."""
    from recs.errors import RunStoreError, ValidationEngineError
    from recs.nightly.artifacts import RunStore

    url = (tmp_path / "store").as_uri()
    try:
        p1, s1 = night(tmp_path / "b", 1)  # before the store was set up
        validate_run(p1, s1)
        publish_run(p1, s1)
        _store_on(monkeypatch, url)
        p2, s2 = night(tmp_path / "a", 2)
        validate_run(p2, s2)

        def down(self, run_id):
            raise RunStoreError("run store: cannot write CURRENT: injected")

        with monkeypatch.context() as patch:
            patch.setattr(RunStore, "set_current", down)
            with pytest.raises(RunStoreError, match="injected"):
                publish_run(p2, s2)
        assert current_version(tmp_path / "a" / "published") is None
        assert RunStore(url).current() is None
        publish_run(p2, s2)
        assert RunStore(url).current() == "night_2"
        p3, s3 = night(tmp_path / "b", 3)
        with pytest.raises(ValidationEngineError, match=r"CURRENT = night_2 .* names night_1"):
            validate_run(p3, s3)
        p4, s4 = night(tmp_path / "a", 4)
        assert validate_run(p4, s4)["compared_with"] == "night_2"
        RunStore(url).set_current("night_9")  # say the record was lost or wrong
        rollback(s2, to="night_2")
        assert RunStore(url).current() == "night_2"
    finally:
        get_settings.cache_clear()
        from recs.nightly import artifacts

        artifacts._open.cache_clear()


def test_a_run_store_that_fails_leaves_the_local_retention_done(recs, tmp_path, monkeypatch):
    """(From a review.) The run store fails when gc reaches it: the local snapshot past its
    retention is removed all the same, and gc then exits 2 with one line naming the store."""
    from recs.errors import RunStoreError
    from recs.nightly.artifacts import RunStore

    home = tmp_path / "home"
    (home / "snapshots" / "2026-10-01").mkdir(parents=True)
    age(home / "snapshots" / "2026-10-01", dt.date(2026, 10, 1))
    _store_on(monkeypatch, (tmp_path / "store").as_uri())

    def down(self):
        raise RunStoreError("run store file:///store: cannot read CURRENT: injected")

    monkeypatch.setattr(RunStore, "current", down)
    code, out, err = recs("gc", "--today", "2026-12-01")
    assert code == 2 and "cannot read CURRENT: injected" in one_error(err)
    assert out.splitlines() == ["removed snapshots/2026-10-01"]
    assert not (home / "snapshots" / "2026-10-01").exists()


def test_a_long_run_id_and_a_path_print_whole_on_an_80_column_terminal(recs, tmp_path):
    """``recs runs`` and ``recs report`` on the default 80 columns (captured output, as piped):
    the run id (55 characters) and the Data Docs path stay on one line each, to be copied into
    the next command; the terminal wraps the table's lines instead. A report with no traversals
    recorded says so (it printed ``None``)."""
    long = "scheduled__2026-11-01T00.00.00-a-backfill-of-last-weeks"
    paths, settings = write_good_run(tmp_path / "home", run_id=long)
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    day = paths.snapshot_date.isoformat()
    assert recs("validate", "--snapshot-date", day)[0] == 0
    assert recs("publish", "--snapshot-date", day)[0] == 0
    code, out, _ = recs("runs")
    assert code == 0 and any(long in line for line in out.splitlines()), out
    code, out, _ = recs("report", "--snapshot-date", day)
    docs = str(paths.run_dir / "validation" / "data_docs" / "index.html")
    assert code == 0 and any(docs in line for line in out.splitlines()), out
    hub_line = next(line for line in out.splitlines() if "hub share of traversals" in line)
    assert "none recorded" in hub_line, hub_line
    code, out, _ = recs("report", "--run-id", long)  # no date: that run id's
    assert code == 0 and f"run {long} ({day})" in out
    code, _, err = recs("report", "--run-id", "nope")  # runs there are, none of that id
    assert code == 2 and "no run nope under" in one_error(err)
    import shutil

    shutil.rmtree(paths.run_dir)  # as recs gc does past RECS_RUN_RETENTION_DAYS
    code, _, err = recs("report", "--run-id", long)  # (a newcomer: sent to `recs runs`, which
    assert code == 2 and one_error(err).endswith(  # lists it, and round again)
        f"its folder is gone (`recs gc` removes runs older than RECS_RUN_RETENTION_DAYS), its "
        f"published version is not: `recs runs show {long}` shows that"
    )
    assert recs("runs", "show", long)[0] == 0


def test_a_setting_the_run_does_not_take_is_named(recs, tmp_path, monkeypatch):
    """(A newcomer's: RECS_GATE_MIN_LIST_SHARE=0.99 for `recs validate`, and the run passed at
    its frozen bound without a word.) validate, publish and shard run name each RECS_* setting
    this environment gives that the run does not take; none when they agree or are unset."""
    paths, settings = write_good_run(tmp_path / "home", run_id="night_1")
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    day = paths.snapshot_date.isoformat()
    frozen = settings.gate_min_list_share
    monkeypatch.setenv("RECS_GATE_MIN_LIST_SHARE", str(frozen))  # the same value: not named
    code, _, err = recs("validate", "--snapshot-date", day)
    assert code == 0 and not any("warning: not taken" in line for line in err), err
    monkeypatch.setenv("RECS_DATASETS_DIR", str(tmp_path / "elsewhere"))  # where, not what:
    monkeypatch.setenv("RECS_DUCKDB_MEMORY_LIMIT", "3GB")  # never named (a second review's)
    monkeypatch.setenv("RECS_GATE_MAX_DROP", f"{settings.gate_max_drop:.3f}0")  # same value
    monkeypatch.setenv("RECS_FILL_SHORT_LISTS", str(not settings.fill_short_lists))  # the API's
    code, _, err = recs("validate", "--snapshot-date", day)
    assert code == 0 and not any("warning: not taken" in line for line in err), err
    monkeypatch.setenv("RECS_GATE_MIN_LIST_SHARE", "0.99")
    monkeypatch.setenv("RECS_HOP1_CAP", "7")
    for command in ("validate", "publish"):
        code, _, err = recs(command, "--snapshot-date", day)
        assert code == 0, err
        assert [line for line in err if "warning: not taken" in line] == [
            "recs: warning: not taken by run night_1, which keeps the settings frozen at its "
            f"snapshot: RECS_GATE_MIN_LIST_SHARE=0.99 (the run's: {frozen}), RECS_HOP1_CAP=7 "
            f"(the run's: {settings.hop1_cap}); a new run takes them"
        ]


def test_summary_finds_its_run_as_report_does(recs, tmp_path):
    """(A newcomer's.) ``recs summary`` without ``--snapshot-date`` reads the run ``recs
    report`` reads: the newest that froze a snapshot, or the given run id's latest date; it
    required the date before. Two runs of two dates: the later one is taken, and a run id
    picks its own."""
    home = tmp_path / "home"
    for day, run_id in ((dt.date(2026, 10, 30), "older"), (dt.date(2026, 10, 31), "newer")):
        paths, settings = write_good_run(home, run_id=run_id, snapshot_date=day)
        paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
        paths.snapshot_manifest.write_text(
            json.dumps({"settings": settings.model_dump(mode="json"), "shard_count": 4})
        )
    titles = {}
    for command in ("summary", "report"):
        code, out, _ = recs(command)
        assert code == 0, out
        titles[command] = out.splitlines()[0].strip()
    assert titles == {"summary": "run newer (2026-10-31)", "report": "run newer (2026-10-31)"}
    code, out, _ = recs("summary", "--run-id", "older", "--json")
    assert code == 0
    document = json.loads(out)
    assert (document["run_id"], document["snapshot_date"]) == ("older", "2026-10-30")
    assert (document["totals"]["shards_done"], document["totals"]["shard_count"]) == (4, 4)
    code, _, err = recs("summary", "--run-id", "nope")
    assert code == 2 and "no run nope under" in one_error(err)
    # (a review's) what is not a frozen run is passed over, however many there are: a folder
    # that is no date (50 inside), a date that is no date, a newer run of an id not frozen yet
    for number in range(50):
        (home / "runs" / "backup" / f"r{number}").mkdir(parents=True)
    (home / "runs" / "2026-13-01" / "older" / "snapshot").mkdir(parents=True)
    (home / "runs" / "2026-11-02" / "older").mkdir(parents=True)
    for junk in ("2026-11-03/backup copy", "2026-11-04/.trash"):  # (a second review's) copies
        (home / "runs" / junk / "snapshot").mkdir(parents=True)  # of a run, with its snapshot
        (home / "runs" / junk / "snapshot" / "manifest.json").write_text("{}")
    for command in (("summary",), ("report",), ("summary", "--run-id", "older", "--json")):
        code, out, err = recs(*command)
        assert code == 0, err
        assert "newer" in out or "older" in out
    assert json.loads(out)["snapshot_date"] == "2026-10-30"
    # two runs of one date: the same run with the date as without it (the latest frozen)
    paths, settings = write_good_run(home, run_id="again", snapshot_date=dt.date(2026, 10, 31))
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    os.utime(home / "runs" / "2026-10-31" / "newer")  # changed last, frozen first
    chosen = {json.loads(recs("summary", *extra, "--json")[1])["run_id"]
              for extra in ((), ("--snapshot-date", "2026-10-31"))}  # fmt: skip
    assert chosen == {"again"}


def test_recs_runs_keeps_a_run_id_whole_beside_200_carried_over_shards(recs, tmp_path):
    """(From a review.) A version carrying 200 shards over from a 64-character run id: on 80
    columns its row keeps the run id, date and counts on one line (they were cut with "…" and
    the counts dropped), and the carried-over list wraps with every entry whole."""
    origin = "scheduled__2026-11-01T00.00.00-a-backfill-of-last-weeks-abcdefgh"
    shards = [{"shard_id": i, "status": "carried_over", "carried_from": origin} for i in range(200)]
    version = tmp_path / "home" / "published" / origin
    version.mkdir(parents=True)
    (version / "manifest.json").write_text(json.dumps({
        "run_id": origin, "snapshot_date": "2026-11-01", "shard_count": 200, "rows": 7,
        "users": 5, "shards": shards,
    }))  # fmt: skip
    code, out, _ = recs("runs")
    lines = out.splitlines()
    assert code == 0 and any(origin in line and "2026-11-01" in line for line in lines), lines[:5]
    assert sum(line.count(f"({origin})") for line in lines) == 200


def test_a_relative_home_is_named_in_full(recs, tmp_path, monkeypatch):
    """(From a review.) ``RECS_HOME`` defaults to the relative ``data``: what a command prints
    as JSON names its files from the root, not from a working directory the reader cannot
    see (``Settings.home`` is made absolute once, where it is read)."""
    night(tmp_path / "home", 1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECS_HOME", "home")
    code, out, _ = recs("validate", "--snapshot-date", "2026-11-01", "--json")
    assert code == 0
    validation = tmp_path / "home" / "runs" / "2026-11-01" / "night_1" / "validation"
    assert json.loads(out)["summary"] == str(validation / "summary.json")
    monkeypatch.setenv("RECS_HOME", "~no-such-user-here/data")  # (a review's) no traceback
    code, _, err = recs("runs")
    assert code == 2 and one_error(err) == (
        "recs: error: invalid setting RECS_HOME: cannot expand '~no-such-user-here/data': "
        "Could not determine home directory."
    )


def test_summary_says_whether_the_run_is_published_and_served(recs, tmp_path):
    """(From a newcomer: a second `make demo` published its date beside a later snapshot's
    version, which CURRENT kept naming and `recs recommend` served; only the DAG's log said so.)
    The summary says it for each case."""
    home = tmp_path / "home"
    for day in (1, 2):
        night(home, day)

    states = []

    def published(day: int) -> str:  # the words; the state is kept in `states`
        code, out, _ = recs("summary", "--snapshot-date", f"2026-11-0{day}", "--json")
        assert code == 0
        totals = json.loads(out)["totals"]
        states.append(totals["published"])
        return totals["published_detail"]

    assert published(2) == "no"
    assert recs("validate", "--snapshot-date", "2026-11-02")[0] == 0
    assert recs("publish", "--snapshot-date", "2026-11-02")[0] == 0
    assert published(2) == "yes, and CURRENT names it (served)"
    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0
    assert recs("publish", "--snapshot-date", "2026-11-01")[0] == 0
    assert published(1) == (
        "yes, beside CURRENT night_2, which is served: `recs rollback --to night_1`"
    )
    (home / "published" / "CURRENT").write_text("")  # damaged from outside
    assert published(2) == "yes, but CURRENT names no version (`recs runs` says why)"
    (home / "published" / "CURRENT").write_text("night_2\n")
    manifest = home / "published" / "night_2" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # (a review's) truncated: not "no"
    assert published(2).startswith(
        "damaged: CURRENT names it, but it cannot be served (published version 'night_2' is "
        f"damaged: {manifest} is damaged: not readable JSON"
    )
    next((home / "published" / "night_1").rglob("recommendations.parquet")).unlink()
    assert published(1).startswith("damaged: it cannot be served (published version 'night_1'")
    code, out, _ = recs("summary", "--snapshot-date", "2026-11-01")  # the words, printed
    assert code == 0 and "damaged: it cannot be served" in " ".join(out.split())
    from recs.nightly.runs import RunPaths

    again = RunPaths.create(home, dt.date(2026, 11, 3), "night_1")  # an id used before
    again.snapshot_dir.mkdir(parents=True)
    again.snapshot_manifest.write_text(json.dumps({"shard_count": 4}))
    code, out, _ = recs("summary", "--snapshot-date", "2026-11-03", "--json")
    totals = json.loads(out)["totals"]
    assert (totals["published"], totals["published_detail"]) == (
        "other_snapshot", "no (the published night_1 is of another snapshot: 2026-11-01)"
    )
    assert states == ["no", "served", "beside_current", "current_unset", "damaged", "damaged"]


def test_summary_says_a_published_version_was_removed_since(recs, tmp_path, monkeypatch):
    """(From a newcomer: "published: no" of a run served for days, after `recs gc` removed its
    version.) A run whose version gc removed says when it was published and that it is gone; a
    run never published still says "no"."""
    home = tmp_path / "home"
    for day in (1, 2, 3, 4):
        night(home, day)
        assert recs("validate", "--snapshot-date", f"2026-11-0{day}")[0] == 0
        assert recs("publish", "--snapshot-date", f"2026-11-0{day}")[0] == 0
    night(home, 5)
    monkeypatch.setenv("RECS_PUBLISHED_RETENTION_VERSIONS", "2")
    code, out, err = recs("gc", "--today", "2026-12-01")  # CURRENT night_4 and night_3 stay
    assert (code, out) == (0, "removed published/night_1\nremoved published/night_2\n"), err

    def published(day: int) -> tuple[str, str]:
        code, out, _ = recs("summary", "--snapshot-date", f"2026-11-0{day}", "--json")
        assert code == 0
        totals = json.loads(out)["totals"]
        return totals["published"], totals["published_detail"]

    at = next(e["at"] for e in history.events(home / "published") if e["run_id"] == "night_1")
    assert published(1) == (
        "removed",
        f"no longer: published at {at}, its version has been removed since (`recs gc` keeps "
        "the RECS_PUBLISHED_RETENTION_VERSIONS most recently used)",
    )
    assert published(5) == ("no", "no")
    assert published(3)[0] == "beside_current"
    from recs.nightly.runs import RunPaths
    from recs.report.content import list_runs, run_report

    report = run_report(RunPaths.find(home, "2026-11-01", "night_1"))["run"]
    assert (report["published"], report["removed_since"]) == (False, at)  # the run view's too
    runs = {r["run_id"]: r for r in list_runs(home)}
    assert (runs["night_1"]["removed_since"], runs["night_5"]["removed_since"]) == (at, None)
    code, out, _ = recs("report", "--snapshot-date", "2026-11-01")
    assert f"no longer: published at {at}, its version has been removed since" in " ".join(
        out.split()
    )
    # night_1 again, of another date, once its version is gone: never published itself
    reused = RunPaths.create(home, dt.date(2026, 11, 9), "night_1")
    reused.snapshot_dir.mkdir(parents=True)
    reused.snapshot_manifest.write_text(json.dumps({"shard_count": 4}))
    assert published(9) == ("no", "no")
    events = home / "published" / history.HISTORY_FILE  # (a review's: a traceback, then exit 74)
    with events.open("ab") as handle:
        handle.write(b"\xff\xfe\n")  # bytes that are not UTF-8: their line is skipped
    assert published(1)[0] == "removed"
    events.unlink()
    events.mkdir()  # a folder in its place: the summary still answers
    assert published(1) == ("no", "no")


def test_summary_marks_a_verdict_older_than_the_shards_as_stale(recs, tmp_path):
    """(From a newcomer: a rerun stopped before its gate showed 4 of 4 shards computed beside
    the earlier attempt's "nothing to validate".) A shard output newer than the verdict marks
    it stale; validating again clears the mark."""
    paths, _ = night(tmp_path / "home", 1)

    def validation() -> tuple[str, bool]:
        code, out, _ = recs("summary", "--json")
        assert code == 0
        totals = json.loads(out)["totals"]
        return totals["validation"], totals["validation_stale"]

    def printed() -> str:  # the table's text, its rules and wrapping left out
        code, out, _ = recs("summary")
        assert code == 0
        text = " ".join(out.replace("│", " ").split())
        return text[text.index("validation") : text.index(" published")]

    assert validation() == ("not_run", False)
    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0
    assert validation() == ("passed", False) and printed() == "validation passed"
    judged = (paths.validation_dir / "summary.json").stat().st_mtime
    os.utime(paths.shard_manifest(2), (judged + 5, judged + 5))  # shard 2 rerun since
    assert validation() == ("passed", True)
    assert printed() == (
        "validation passed (stale: shards were computed since; `recs validate` judges them)"
    )
    assert recs("validate", "--snapshot-date", "2026-11-01")[0] == 0
    os.utime(paths.shard_manifest(2), (judged, judged))
    assert validation() == ("passed", False)


def test_a_run_picked_among_others_of_its_date_is_named_with_them(recs, tmp_path):
    """(From a newcomer: a `recs run --run-id ctrlc-test` stopped by Ctrl-C became the run
    every command of that date read, validated and published, without a word.) Picked without
    --run-id among other frozen runs of the date, the run is named with the others; given
    --run-id, or alone on its date, nothing is said."""
    home = tmp_path / "home"
    first, _ = night(home, 1)
    code, _, err = recs("summary", "--snapshot-date", "2026-11-01")
    assert code == 0 and err == []
    second, settings = write_good_run(home, run_id="ctrlc-test", snapshot_date=dt.date(2026, 11, 1))
    second.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    note = ("recs: note: 2026-11-01 has 2 runs; this is ctrlc-test, frozen last (--run-id "
            "picks another: night_1)")  # fmt: skip
    for args in (("summary", "--snapshot-date", "2026-11-01"), ("summary",),
                 ("validate", "--snapshot-date", "2026-11-01")):  # fmt: skip
        code, _, err = recs(*args)
        assert code == 0 and err == [note], args
    code, _, err = recs("summary", "--snapshot-date", "2026-11-01", "--run-id", "night_1")
    assert code == 0 and err == []


def test_summary_and_report_name_the_stage_a_recs_run_stopped_at(recs, tmp_path):
    """(From a newcomer, whose rerun stopped at build_graph: neither said so.) ``recs run``
    records the stage it raised in beside the stage times (``pipeline._record_times``): the
    summary prints it with the error, the report marks the stage failed and names it; a gate
    run alone amends the times and keeps it (it is the last `recs run`'s)."""
    paths, settings = write_good_run(tmp_path / "home")
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    paths.stage_times.write_text(json.dumps({
        "stages": {"freeze_snapshot": 1.5, "build_models": 9.0, "validate_run": 1234.5},
        "stopped_at": {"stage": "build_graph", "error": "InDegreeMismatchError: injected"},
    }))  # fmt: skip
    day = paths.snapshot_date.isoformat()
    code, out, _ = recs("summary", "--snapshot-date", day, "--json")
    totals = json.loads(out)["totals"]
    assert code == 0 and totals["stopped_at"] == {
        "stage": "build_graph", "error": "InDegreeMismatchError: injected"
    }  # fmt: skip
    code, out, _ = recs("report", "--snapshot-date", day, "--json")
    stages = {row["stage"]: (row["state"], row["seconds"]) for row in json.loads(out)["stages"]}
    assert stages["build_graph"] == ("failed", None) and stages["build_models"] == (None, 9.0)
    code, out, _ = recs("report", "--snapshot-date", day)
    line = next(line for line in out.splitlines() if "failed stages" in line)
    assert code == 0 and "build_graph" in line, out
    assert recs("validate", "--snapshot-date", day)[0] == 0
    recorded = json.loads(paths.stage_times.read_text())
    assert recorded["stages"]["validate_run"] != 1234.5
    assert recorded["stopped_at"]["stage"] == "build_graph"


def test_a_stage_that_passes_alone_clears_where_recs_run_stopped_at_it(recs, tmp_path):
    """(From a review: a publish that failed in `recs run`, then passed on its own, still showed
    as failed.) The last `recs run` stopped at validate_run; `recs validate` passes and clears
    it. A record whose ``stopped_at`` is not an object (damaged) is ignored by the summary and
    the report alike (the report raised AttributeError)."""
    paths, settings = write_good_run(tmp_path / "home")
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    day = paths.snapshot_date.isoformat()
    for damaged in ("build_graph", ["build_graph"]):
        paths.stage_times.write_text(json.dumps({"stages": {}, "stopped_at": damaged}))
        code, out, _ = recs("report", "--snapshot-date", day, "--json")
        assert code == 0 and {r["state"] for r in json.loads(out)["stages"]} == {None}
        code, out, _ = recs("summary", "--snapshot-date", day, "--json")
        assert code == 0 and json.loads(out)["totals"]["stopped_at"] is None
    paths.stage_times.write_text(json.dumps({
        "stages": {"freeze_snapshot": 1.5},
        "stopped_at": {"stage": "validate_run", "error": "ValidationEngineError: injected"},
    }))  # fmt: skip
    assert recs("validate", "--snapshot-date", day)[0] == 0
    recorded = json.loads(paths.stage_times.read_text())
    assert "stopped_at" not in recorded and recorded["stages"]["freeze_snapshot"] == 1.5
    assert isinstance(recorded["stages"]["validate_run"], float)


def test_where_recs_run_stopped_is_not_written_over_its_error(tmp_path, monkeypatch):
    """(From a review.) The record of where `recs run` stopped cannot be written (a full disk):
    a warning, and the stage's own error is the one raised (the CLI's exit code is its)."""
    from recs.errors import CorruptFileError
    from recs.nightly import pipeline
    from recs.nightly.runs import RunPaths

    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.run_dir.mkdir(parents=True)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline, "write_json", disk_full)
    try:
        raise CorruptFileError("injected: the stage's own error")
    except CorruptFileError as error:
        pipeline._record_stop(paths, {}, "build_graph", error)  # does not raise
    assert not paths.stage_times.exists()
