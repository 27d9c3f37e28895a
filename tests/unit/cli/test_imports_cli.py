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
    ],
)
def test_user_errors_are_one_line(recs, tmp_path, args, needle):
    (tmp_path / "e.csv").write_text("follower_id,followee_id\n1,2\n")
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
