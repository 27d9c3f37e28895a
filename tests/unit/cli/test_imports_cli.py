"""``recs import``: sub-commands and options built from IMPORT_TABLES, the column options reach
the import, output (table or --json), and every user error is one line ``recs: error: …``."""

from __future__ import annotations

import json
import sqlite3

import pytest

from recs.config import get_settings
from recs.imports.tables import IMPORT_TABLES, REJECT_REASONS


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Relative paths in the commands are files of the test's folder."""
    monkeypatch.chdir(tmp_path)


def one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("recs: error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(lines), lines
    return errors[0]


def test_help_lists_every_table_its_column_options_and_the_defaults(recs):
    code, out, _ = recs("import", "--help")
    assert code == 0
    for command in IMPORT_TABLES:
        assert command in out
    for reason in REJECT_REASONS:
        assert reason in out
    assert "2000-01-01T00:00:00Z" in out and "one store transaction" in out
    for spec in IMPORT_TABLES.values():
        code, out, _ = recs("import", spec.command, "--help")
        assert code == 0
        for column in spec.columns:
            assert column.option in out, (spec.command, column.option)


def test_column_options_and_json_output(recs, tmp_path):
    """A headerless bitcoin-OTC-like file: ids in columns 1 and 2, epoch seconds in 4."""
    (tmp_path / "otc.csv").write_text("6,2,4,1289241911.72836\n6,5,2,1289241941.53378\n")
    code, out, err = recs(
        "import",
        "edges",
        "otc.csv",
        "--created-at-col",
        "4",
        "--time-format",
        "epoch-s",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["loaded"] == 2 and summary["users_created"] == 3
    assert summary["atomicity"].startswith("one transaction")
    connection = sqlite3.connect(tmp_path / "home" / "live.db")
    rows = connection.execute("SELECT * FROM follow_edges ORDER BY 1, 2").fetchall()
    connection.close()
    assert rows == [
        (6, 2, "2010-11-08 18:45:11.728360", "active", None, None),
        (6, 5, "2010-11-08 18:45:41.533780", "active", None, None),
    ]


def test_the_human_output_says_what_was_rejected_and_how_it_was_written(recs, tmp_path):
    (tmp_path / "e.tsv").write_text("follower_id\tfollowee_id\n1\t1\n1\t2\n")
    code, out, err = recs("import", "edges", "e.tsv", "--rejects", "bad.csv")
    assert code == 0
    assert "imported edges into follow_edges" in out
    assert any("rejected by reason: self_loop 1" in line and "bad.csv" in line for line in err)
    assert any(line.startswith("written in one transaction") for line in err)
    assert (tmp_path / "bad.csv").read_text().splitlines()[1].startswith("2,self_loop,")
    assert not any(line.startswith("hint:") for line in err)


def test_users_an_import_of_edges_created_are_updated_on_the_hint(recs, tmp_path):
    (tmp_path / "e.csv").write_text("follower_id,followee_id\n1,2\n")
    (tmp_path / "u[").mkdir()  # "[/]" in the path: printed as it is, not read as Rich markup
    (tmp_path / "u[/].csv").write_text("user_id,account_status\n1,suspended\n2,active\n")
    assert recs("import", "edges", "e.csv")[0] == 0
    code, out, err = recs("import", "users", "u[/].csv")
    hints = [line for line in err if line.startswith("hint:")]
    assert "hint" not in out  # not a row of the table
    assert code == 0 and hints == [
        "hint: accounts of u[/].csv already in the store: 2; if an earlier import created them "
        "with default columns (one of edges, say), import this file again with "
        "--update-existing to set their columns from it"
    ]
    code, out, _ = recs("import", "users", "u[/].csv", "--update-existing", "--json")
    assert code == 0 and json.loads(out)["updated"] == 2


def test_columns_no_option_names_are_named_as_not_imported(recs, tmp_path):
    """A users file's `status` is not `account_status`: loaded as active unless mapped, so the
    output warns about it (and --json lists it); mapped with --status-col it is imported."""
    (tmp_path / "u.csv").write_text("user_id,status,nickname\n1,suspended,x\n")
    code, out, err = recs("import", "users", "u.csv", "--json")
    assert code == 0 and json.loads(out)["ignored_columns"] == ["status", "nickname"]
    code, _, err = recs("import", "users", "u.csv", "--replace", "--status-col", "status")
    assert code == 0
    assert any(line.endswith("no --<column>-col names them): nickname") for line in err), err


def test_generate_missing_says_what_it_generated(recs, tmp_path):
    (tmp_path / "e.csv").write_text(
        "follower_id,followee_id\n" + "".join(f"{i},{(i + 1) % 20}\n" for i in range(20))
    )
    code, _out, err = recs("import", "edges", "e.csv", "--generate-missing", "--seed", "3")
    assert code == 0
    generated = [line for line in err if line.startswith("generated (not in the input, seed 3)")]
    assert generated and "users.account_status" in generated[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["import", "edges", "missing.csv"], "no such file: missing.csv"),
        (["import", "edges"], "give a file to import"),
        (["import", "edges", "e.csv", "--follower-col", "src"], "--follower-col src: e.csv has"),
        (["import", "edges", "e.csv", "--time-format", "unix"], "--time-format must be"),
        (["import", "edges", "e.csv", "--separator", "ab"], "--separator must be"),
        (["import", "edges", "e.csv", "--default-time", "soon"], "--default-time must be"),
        (["import", "users", "e.csv"], "has no column user_id"),
        (["import", "edges", "--from-sql", "sqlite:///nowhere.db"], "needs --query"),
        (["import", "edges", "e.csv", "--format", "xlsx"], "--format must be"),
        (["import", "edges", "e.csv", "--bogus"], "No such option: --bogus"),
        (["import", "edges", "empty.csv"], "empty.csv is empty: no header and no rows"),
    ],
)
def test_user_errors_are_one_line(recs, tmp_path, args, needle):
    (tmp_path / "e.csv").write_text("follower_id,followee_id\n1,2\n")
    (tmp_path / "empty.csv").write_text("")  # a newcomer's: "has no column ... (columns: none)"
    code, _out, err = recs(*args)
    assert code == 2
    assert needle in one_error(err)
    assert not (tmp_path / "home" / "live.db").exists()  # nothing written, not even a schema


def test_an_unreachable_postgresql_store_is_one_line(recs, tmp_path, monkeypatch):
    (tmp_path / "e.csv").write_text("follower_id,followee_id\n1,2\n")
    monkeypatch.setenv("RECS_STORE_URL", "postgresql://nobody:secret@127.0.0.1:1/none")
    get_settings.cache_clear()
    code, _out, err = recs("import", "edges", "e.csv")
    line = one_error(err)
    assert code == 2 and "cannot open the live store" in line and "secret" not in line


def store(tmp_path, sql: str) -> list[tuple]:
    connection = sqlite3.connect(tmp_path / "home" / "live.db")
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("command", "text", "options", "sql", "expected"),
    [
        (
            "users",
            "id;joined;seen;state;disc;priv\n7;2020-01-01;2026-10-01T00:00:00Z;suspended;n;y\n",
            [
                "--user-col",
                "id",
                "--created-at-col",
                "joined",
                "--last-active-at-col",
                "seen",
                "--status-col",
                "state",
                "--discoverable-col",
                "disc",
                "--private-col",
                "priv",
            ],
            "SELECT * FROM users",
            [(7, "2020-01-01 00:00:00.000000", "2026-10-01 00:00:00.000000", "suspended", 0, 1)],
        ),
        (
            "edges",
            "a;b;at;st\n1;2;2026-01-01;pending\n",
            [
                "--follower-col",
                "a",
                "--followee-col",
                "b",
                "--created-at-col",
                "at",
                "--status-col",
                "st",
            ],
            "SELECT follower_id, followee_id, created_at, status FROM follow_edges",
            [(1, 2, "2026-01-01 00:00:00.000000", "pending")],
        ),
        (
            "blocks",
            "x;y;t\n1;2;2026-02-01\n",
            ["--blocker-col", "x", "--blocked-col", "y", "--created-at-col", "t"],
            "SELECT blocker_id, blocked_id, created_at FROM blocks",
            [(1, 2, "2026-02-01 00:00:00.000000")],
        ),
        (
            "mutes",
            "x;y\n3;4\n",
            ["--muter-col", "x", "--muted-col", "y", "--default-time", "2024-05-06T07:08:09Z"],
            "SELECT muter_id, muted_id, created_at FROM mutes",
            [(3, 4, "2024-05-06 07:08:09.000000")],
        ),
        (
            "dismissals",
            "x;y;t\n5;6;06/11/2026\n",
            [
                "--user-col",
                "x",
                "--candidate-col",
                "y",
                "--dismissed-at-col",
                "t",
                "--time-format",
                "%d/%m/%Y",
            ],
            "SELECT user_id, candidate_id, dismissed_at FROM dismissed_candidates",
            [(5, 6, "2026-11-06 00:00:00.000000")],
        ),
        (
            "interests",
            "x;y\n5;jazz\n",
            ["--user-col", "x", "--tag-col", "y"],
            "SELECT user_id, tag FROM user_interests",
            [(5, "jazz")],
        ),
    ],
)
def test_every_column_option_of_every_table(recs, tmp_path, command, text, options, sql, expected):
    (tmp_path / "in.csv").write_text(text)
    code, _out, err = recs("import", command, "in.csv", *options, "--separator", "semicolon")
    assert code == 0, err
    assert store(tmp_path, sql) == expected


def test_reading_options_format_header_comment(recs, tmp_path):
    """--format tsv on a .dat file with '%' comments; then --comment '' makes '#1,2' a data
    line (rejected: not an id) and --replace leaves only 3 -> 4."""
    (tmp_path / "g.dat").write_text("% exported\n10\t11\n11\t12\n")
    code, out, err = recs("import", "edges", "g.dat", "--format", "tsv", "--comment", "%", "--json")
    assert code == 0, err
    assert json.loads(out)["loaded"] == 2
    (tmp_path / "h.csv").write_text("#1,2\n3,4\n")
    code, out, err = recs(
        "import", "edges", "h.csv", "--comment", "", "--no-header", "--json", "--replace"
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["rejected_by_reason"] == {"non_integer_id": 1} and summary["loaded"] == 1
    assert store(tmp_path, "SELECT follower_id, followee_id FROM follow_edges") == [(3, 4)]
