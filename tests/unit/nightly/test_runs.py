"""recs.nightly.runs: run ids are checked, never rewritten (except Airflow's ``:`` ``+`` ``~``)."""

from __future__ import annotations

import datetime as dt

import pytest

from recs.errors import RecsError, RunNotFoundError
from recs.nightly.runs import RunPaths, check_run_id, parse_snapshot_date, run_id_from_airflow

RULE = (
    "run ids are 1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit, "
    "without '..'"
)


@pytest.mark.parametrize("run_id", ["a", "cli__2026-11-01", "night_1", "v1.2-rc", "x" * 64, "0"])
def test_valid_run_ids_are_returned_unchanged(run_id):
    assert check_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "run_id",
    ["", "../../x", "a/b", "a\\b", ".x", "_x", "-x", "a..b", "x" * 65, "a b", "é", "a\n"],
)
def test_invalid_run_ids_raise_one_line_naming_the_rule(run_id):
    with pytest.raises(RecsError) as raised:
        check_run_id(run_id)
    assert str(raised.value) == f"invalid run id {run_id!r}: {RULE}"
    assert raised.value.exit_code == 2


def test_run_paths_reject_rather_than_rewrite(tmp_path):
    """``create`` used to turn ``../../x`` into ``x`` and ``""`` into the default id."""
    for bad in ("../../x", ""):
        with pytest.raises(RecsError, match="invalid run id"):
            RunPaths.create(tmp_path, "2026-11-01", bad)
        with pytest.raises(RecsError, match="invalid run id"):
            RunPaths.find(tmp_path, "2026-11-01", bad)
    assert RunPaths.create(tmp_path, "2026-11-01", None).run_id == "cli__2026-11-01"


def test_airflow_run_ids_map_their_separators_and_are_then_checked():
    """``scheduled__2026-11-01T01:00:00+00:00`` → ``:`` and ``+`` become ``_`` (the folder
    name the DAG always used); anything else outside the rule fails."""
    assert (
        run_id_from_airflow("scheduled__2026-11-01T01:00:00+00:00")
        == "scheduled__2026-11-01T01_00_00_00_00"
    )
    assert (
        run_id_from_airflow("manual__2026-11-01T01:00:00.123456+00:00")
        == "manual__2026-11-01T01_00_00.123456_00_00"
    )
    for bad in ("../../x", "..", "a" * 65, "", "_x"):
        with pytest.raises(RecsError, match=r"invalid run id .*: run ids are"):
            run_id_from_airflow(bad)


def test_an_airflow_run_id_given_to_the_cli_names_its_run():
    """(From a newcomer.) The id Airflow's UI shows is refused (its ``:`` and ``+``), with the
    run id it runs under; an id no mapping saves gets the rule alone."""
    airflow_id = "manual__2026-12-06T00:01:16.071561+00:00"
    with pytest.raises(RecsError) as raised:
        check_run_id(airflow_id)
    assert str(raised.value) == (
        f"invalid run id {airflow_id!r}: {RULE} (an Airflow run id? its run is "
        "'manual__2026-12-06T00_01_16.071561_00_00')"
    )
    with pytest.raises(RecsError) as raised:
        check_run_id("a:" + "x" * 70)
    assert str(raised.value).endswith(RULE)


@pytest.mark.parametrize(
    ("value", "what", "message"),
    [
        ("2026-11-31", "snapshot date", "invalid snapshot date '2026-11-31': no such day (day is "
         "out of range for month)"),
        ("2026-13-01", "--today date", "invalid --today date '2026-13-01': no such day (month "
         "must be in 1..12)"),
        ("11/01/2026", "snapshot date", "invalid snapshot date '11/01/2026': expected YYYY-MM-DD, "
         "e.g. 2026-11-01"),
        # (a newcomer's) ISO 8601's other forms, padding and non-ASCII digits are refused too
        *[(value, "snapshot date", f"invalid snapshot date {value!r}: expected YYYY-MM-DD, "
           "e.g. 2026-11-01") for value in ("20261101", "2026-W44-7", " 2026-11-01",
                                            "\uff12\uff10\uff12\uff16-11-01")],
    ],
)  # fmt: skip
def test_a_bad_date_says_what_is_wrong_with_it(value, what, message):
    """(From a newcomer.) ``2026-11-31`` has the shape asked for: it is not a day."""
    with pytest.raises(RecsError) as raised:
        parse_snapshot_date(value, what)
    assert str(raised.value) == message and raised.value.exit_code == 2


def test_as_of_unchanged():
    paths = RunPaths.create("h", "2026-11-01", "r")
    assert paths.as_of == dt.datetime(2026, 11, 2, tzinfo=dt.UTC)


def test_a_date_without_a_run_says_when_it_can_have_one(tmp_path):
    """(From a newcomer, who ran the hint's `recs run` for today and was refused: the day was
    not over.) The remedy names the cut-off after which the date can be run."""
    with pytest.raises(RunNotFoundError) as raised:
        RunPaths.find(tmp_path, "2026-12-31")
    assert str(raised.value).endswith(
        "`recs run --snapshot-date 2026-12-31` first, once the day is over "
        "(2027-01-01 00:00 UTC)"
    )


def test_a_past_date_without_a_run_names_the_rebuild_unless_its_snapshot_is_retained(tmp_path):
    """(From a newcomer, who ran the hint's `recs run` for a month-old date and was refused:
    the store had moved past it.) A past date: without a retained snapshot the remedy adds
    --rebuild-snapshot; with one, the run reuses it."""
    with pytest.raises(RunNotFoundError) as raised:
        RunPaths.find(tmp_path, "2026-10-01")
    assert str(raised.value).endswith(
        "`recs run --snapshot-date 2026-10-01` first; no snapshot of that date is retained here, "
        "so give that `recs run` --rebuild-snapshot (the DAG's rebuild_snapshot param) if the "
        "live store has moved past it (README, 'Backfills and reruns')"
    )
    (tmp_path / "snapshots" / "2026-10-01").mkdir(parents=True)
    (tmp_path / "snapshots" / "2026-10-01" / "manifest.json").write_text("{}")
    with pytest.raises(RunNotFoundError) as raised:
        RunPaths.find(tmp_path, "2026-10-01")
    assert str(raised.value).endswith(
        "`recs run --snapshot-date 2026-10-01` first (it reuses the date's retained snapshot)"
    )


@pytest.mark.parametrize(
    ("relative", "says"),
    [
        (
            "exports/follow_exclusions/shard_id=1/data_0.parquet",
            "written by build_models; `recs run --snapshot-date 2026-11-01 --run-id r` runs the "
            "night again from its retained snapshot (in Airflow: clear that task and the ones "
            "after it)",
        ),
        (
            "shards/shard_id=002/recommendations.parquet",
            "written by traverse_shard; `recs shard run --snapshot-date 2026-11-01 --run-id r "
            "--shard 2` writes it again",
        ),
        (
            "snapshot/users.parquet",
            "written by freeze_snapshot; `recs run --snapshot-date 2026-11-01 --run-id r` makes "
            "the run's snapshot again from the date's retained one, which it checks first (its "
            "files are often the same: hard links)",
        ),
    ],
)
def test_a_damaged_run_file_names_the_stage_that_writes_it_and_the_command(
    tmp_path, relative, says
):
    """(From a newcomer's run.) "rerun the stage that wrote it" named neither the stage nor a
    command; a file outside the run, or an error without a path, passes unchanged."""
    from recs.errors import CorruptFileError
    from recs.files import read_parquet
    from recs.nightly.runs import naming_the_stage

    paths = RunPaths.create(tmp_path, "2026-11-01", "r")
    damaged = paths.run_dir / relative
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"PAR1 cut")
    with pytest.raises(CorruptFileError) as raised, naming_the_stage(paths):
        read_parquet(damaged)
    assert str(raised.value).startswith(f"{damaged} is unreadable as Parquet (")
    assert str(raised.value).endswith(f"): {says}"), str(raised.value)
    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(b"PAR1 cut")
    for error in (lambda: read_parquet(outside), lambda: (_ for _ in ()).throw(
        CorruptFileError("a message without a path"))):  # fmt: skip
        with pytest.raises(CorruptFileError) as raised, naming_the_stage(paths):
            error()
        assert "written by" not in str(raised.value)
