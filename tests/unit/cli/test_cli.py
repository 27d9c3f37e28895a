"""recs.cli: bad arguments exit non-zero with one line ``recs: error: ...``, before any work.

Each case comes from the adversarial review: ``recs run --run-id ../../x`` (was rewritten to
``x`` and published), ``--run-id ""`` (fell back to the default id), ``recs recommend -1``
("No such option: -1"), ``recs token --ttl`` unbounded, ``recs generate-graph`` checking the
store only after generating.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import insert

from recs.store import schema
from recs.store.connections import engine_for

SECRET = "test-secret-0123456789-abcdefghijklmnop"  # the recs fixture's (conftest.py)
RUN_ID_RULE = (
    "run ids are 1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit, "
    "without '..'"
)
USER_ID_RULE = (
    "expected a non-negative integer below 2**63 in plain decimal (no sign, spaces or "
    "leading zeros)"
)


def _one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("recs: error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(lines), lines
    return errors[0]


# --- run ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "run_id", ["../../x", "", "a/b", ".hidden", "a..b", "-x", "x" * 65, "a b", "scheduled:1"]
)
def test_run_rejects_a_bad_run_id_before_doing_anything(recs, tmp_path, run_id):
    """Exit 2, one line naming the rule; no stage started (no progress line), no run folder."""
    code, _out, err = recs("run", "--snapshot-date", "2026-11-01", "--run-id", run_id)
    assert code == 2
    hint = " (an Airflow run id? its run is 'scheduled_1')" if ":" in run_id else ""
    assert _one_error(err) == f"recs: error: invalid run id {run_id!r}: {RUN_ID_RULE}{hint}"
    assert not any("freeze_snapshot" in line for line in err)
    assert not (tmp_path / "home" / "runs").exists()
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", [["summary"], ["shard", "run", "--shard", "0"]])
def test_other_commands_reject_a_bad_run_id_too(recs, command):
    code, _out, err = recs(*command, "--snapshot-date", "2026-11-01", "--run-id", "../x")
    assert code == 2
    assert _one_error(err) == f"recs: error: invalid run id '../x': {RUN_ID_RULE}"


AFTER = "; it belongs after the command:"


@pytest.mark.parametrize(
    ("argv", "option", "hint"),
    [
        (["--json", "summary"], "--json", f"{AFTER} recs summary --json"),
        (["--json=1", "gc", "--dry-run"], "--json", f"{AFTER} recs gc --json"),
        (["--today", "2026-11-01", "gc"], "--today", f"{AFTER} recs gc --today 2026-11-01"),
        (["--today=2026-11-01", "gc"], "--today", f"{AFTER} recs gc --today=2026-11-01"),
        (["--json", "gc", "--json"], "--json", ""),  # already after it
        (["--", "--json", "summary"], "--json", ". Did you mean 'summary'?"),  # Click's only
        (["shard", "--json", "run"], "--json", f"{AFTER} recs shard run --json"),
        (["--bogus", "summary"], "--bogus", ""),  # no command has it
        (["--today", "2026-11-01", "rollback"], "--today", ""),  # gc has it, rollback does not
        (["summary", "--bogus"], "--bogus", ""),  # in its place, and unknown
        # no command after it: the one command of the group that has it
        (["shard", "--snapshot-date", "2026-11-01"], "--snapshot-date",
         f"{AFTER} recs shard run --snapshot-date 2026-11-01"),
        (["shard", "--shard=3"], "--shard", f"{AFTER} recs shard run --shard=3"),
        (["--today", "2026-11-01"], "--today", f"{AFTER} recs gc --today 2026-11-01"),
        (["--snapshot-date", "2026-11-01"], "--snapshot-date", ""),  # several commands have it
        (["runs", "--dry-run"], "--dry-run", ""),  # no command of `runs` has it
        # an option named as an argument: of the group's one command, or of the command given
        (["runs", "--run-id", "night_1"], "--run-id",
         "; RUN_ID is an argument, not an option: recs runs show night_1"),
        (["runs", "show", "--run-id=night_1"], "--run-id",
         "; RUN_ID is an argument, not an option: recs runs show night_1"),
        (["runs", "--run-id"], "--run-id", "; RUN_ID is an argument, not an option: recs runs "
         "show RUN_ID"),
        # (a review's) no value, an option after it, a value for a shell, a metavar's brackets
        (["runs", "show", "--run-id="], "--run-id", "; RUN_ID is an argument, not an option: "
         "recs runs show RUN_ID"),
        (["runs", "show", "--run-id", "--json"], "--run-id", "; RUN_ID is an argument, not an "
         "option: recs runs show RUN_ID"),
        (["runs", "show", "--run-id", "a b"], "--run-id", "; RUN_ID is an argument, not an "
         "option: recs runs show 'a b'"),
        (["import", "edges", "--path", "x.csv"], "--path", "; PATH is an argument, not an "
         "option: recs import edges x.csv"),
        (["ingest", "--paths", "a", "b"], "--paths", ""),  # several values: not rebuilt
        (["--user-id", "7"], "--user-id", ""),  # recommend and token both take one (metavar)
        # (a review's) read as the user id by a command that takes "-1" as one: the 7 was "extra"
        (["recommend", "--user-id", "7"], "--user-id", "; USER_ID is an argument, not an "
         "option: recs recommend 7"),
        (["token", "--service", "--user", "7"], "--user", ""),
        (["recommend", "--limit", "3", "--user-id=7"], "--user-id", "; USER_ID is an argument, "
         "not an option: recs recommend 7"),
        (["token", "-s", "7"], "-s", ""),
        # (a second review's) a mistyped option with a value is not the user id's
        (["recommend", "--limt=5"], "--limt", ""),
        (["token", "--ttl=60", "--servce=1"], "--servce", ""),
    ],
)  # fmt: skip
def test_an_option_before_its_command_says_where_it_belongs(recs, argv, option, hint):
    """(From a newcomer.) `recs --json summary` got Click's "No such option: --json" alone."""
    code, out, err = recs(*argv)
    assert code == 2 and out == ""
    assert _one_error(err) == f"recs: error: No such option: {option}{hint}"


def test_an_extra_argument_of_a_command_without_a_user_id_stays_one(recs):
    """(From a review.) Only a command that reads "-1" as its user id names an unknown option
    for an extra argument, and never a known option's value: `--rejects --rej.csv` here."""
    code, out, err = recs("import", "edges", "a.csv", "b.csv", "--rejects", "--rej.csv")
    assert (code, out) == (2, "")
    assert _one_error(err) == "recs: error: Got unexpected extra argument(s) (b.csv)"


@pytest.mark.parametrize(
    ("argv", "name"), [(["runs", "show"], "RUN_ID"), (["recommend"], "USER_ID")]
)
def test_a_missing_argument_is_named_as_the_help_names_it(recs, argv, name):
    """(From a newcomer.) `recs runs show` said 'run_id' where `recs recommend` said 'USER_ID'."""
    code, _out, err = recs(*argv)
    assert code == 2 and _one_error(err) == f"recs: error: Missing argument '{name}'."


# --- user ids --------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["recommend", "token"])
@pytest.mark.parametrize("raw", ["-1", "abc", "01", "+1", "1e3", str(2**63)])
def test_bad_user_ids_are_one_line(recs, command, raw):
    code, out, err = recs(command, raw)
    assert code == 2
    assert out == ""
    assert _one_error(err) == f"recs: error: invalid user id {raw!r}: {USER_ID_RULE}"


def test_double_dash_still_works_and_gives_the_same_message(recs):
    code, _out, err = recs("recommend", "--", "-1")
    assert code == 2
    assert _one_error(err) == f"recs: error: invalid user id '-1': {USER_ID_RULE}"


def test_token_accepts_the_largest_id(recs):
    import jwt

    code, out, _err = recs("token", str(2**63 - 1))
    assert code == 0
    claims = jwt.decode(out.strip(), SECRET, algorithms=["HS256"], audience="recs-api")
    assert claims["sub"] == str(2**63 - 1)


# --- token lifetime --------------------------------------------------------------------------
TTL_RULE = "expected 1 to 2,592,000 seconds (30 days)"


@pytest.mark.parametrize("ttl", ["0", "-5", "2592001", "999999999999"])
def test_token_ttl_is_bounded(recs, ttl):
    code, out, err = recs("token", "1", "--ttl", ttl)
    assert code == 2
    assert out == ""
    assert _one_error(err) == f"recs: error: invalid --ttl {ttl}: {TTL_RULE}"


def test_token_ttl_at_the_bounds(recs):
    """1 s and 30 days are accepted: exp - iat equals the ttl."""
    import jwt

    for ttl in (1, 2_592_000):
        code, out, _err = recs("token", "1", "--ttl", str(ttl))
        assert code == 0
        claims = jwt.decode(
            out.strip(), SECRET, algorithms=["HS256"], audience="recs-api",
            options={"verify_exp": False},
        )  # fmt: skip
        assert claims["exp"] - claims["iat"] == ttl


def test_mint_token_refuses_an_unbounded_ttl():
    from recs.serving.auth import mint_token

    for ttl in (0, -1, 2_592_001):
        with pytest.raises(ValueError, match="ttl_seconds"):
            mint_token(SECRET, 1, ttl_seconds=ttl)


def test_token_ttl_setting_is_bounded(monkeypatch):
    from pydantic import ValidationError

    from recs.config import Settings

    with pytest.raises(ValidationError):
        Settings(api_token_ttl_seconds=2_592_001)


# --- the store must be empty before generating -----------------------------------------------
def _store_with_one_user(home):
    from recs.config import Settings

    settings = Settings(home=home)
    engine = engine_for(settings.live_store_url)
    schema.create_schema(engine)
    import datetime as dt

    with engine.begin() as connection:
        connection.execute(
            insert(schema.users),
            [dict(user_id=1, created_at=dt.datetime(2026, 1, 1),
                  last_active_at=dt.datetime(2026, 1, 1), account_status="active",
                  is_discoverable=True)],
        )  # fmt: skip
    engine.dispose()


def test_generate_graph_refuses_a_non_empty_store_before_generating(recs, tmp_path, monkeypatch):
    """The store holds 1 user: one line naming it, and the generator is never called."""
    from recs.demo import synthetic

    _store_with_one_user(tmp_path / "home")

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("generated a graph before checking the store")

    monkeypatch.setattr(synthetic, "synthetic_follow_graph", must_not_run)
    code, _out, err = recs("generate-graph", "--users", "1000000")
    assert code == 2
    line = _one_error(err)
    assert line.startswith("recs: error: the live store ")
    assert "is not empty (1 users): pass --replace" in line


def test_load_dataset_refuses_a_non_empty_store_before_parsing(recs, tmp_path, monkeypatch):
    from recs.demo import datasets

    _store_with_one_user(tmp_path / "home")

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("parsed the dataset before checking the store")

    monkeypatch.setattr(datasets, "read_edges", must_not_run)
    code, _out, err = recs("load-dataset", "slashdot")
    assert code == 2
    assert "is not empty (1 users): pass --replace" in _one_error(err)
    # (a newcomer's find) a mistyped name is named first, not hidden behind --replace
    code, _out, err = recs("load-dataset", "slashdott")
    assert code == 2 and "unknown dataset 'slashdott'" in _one_error(err)


def test_generate_graph_on_a_missing_store_creates_nothing_before_generating(recs, tmp_path):
    """The check only reads: on a fresh home, generate-graph runs as before (10 users)."""
    code, _out, err = recs("generate-graph", "--users", "10", "--json")
    assert code == 0, err
    assert (tmp_path / "home" / "live.db").exists()


# --- ingest into a store that did not exist ------------------------------------------------------
def test_ingest_says_when_it_created_a_new_live_store(recs, tmp_path):
    """RECS_HOME has no live.db (e.g. recs run from another folder, RECS_HOME relative): the
    ingest works (user 1 is created: read 1 = applied 1) and stderr says a new store was
    created at that path; a second ingest into the now existing store says nothing of it."""
    events = tmp_path / "e.jsonl"
    events.write_text(
        '{"event_id": "u1", "event_type": "user_upsert", "event_time": "2026-11-01T00:00:00Z",'
        ' "actor_id": 1}\n'
    )
    store_file = (tmp_path / "home" / "live.db").resolve()
    code, out, err = recs("ingest", str(events), "--json")
    assert code == 0
    assert '"applied": 1' in out
    assert f"note: there was no live store at {store_file}: a new one was created" in " ".join(
        err
    )
    code, _, err = recs("ingest", str(events), "--json")
    assert code == 0
    assert not any("no live store" in line for line in err)


def test_ingest_prints_each_file_path_whole(recs, tmp_path):
    """(From a newcomer's run and a review.) The table names each file by its path, whole on one
    line also when the output is not a terminal (it was cut short with "…" at 80 columns), with
    its spaces, wide characters and brackets as they are ("[/]" was read as Rich markup: a
    MarkupError after the events were applied)."""
    folder = tmp_path / "events of the night [" / ("] 夜夜 [red]" + "x" * 60)  # "[/]" in the path
    folder.mkdir(parents=True)
    events = folder / "e.jsonl"
    events.write_text(
        '{"event_id": "u1", "event_type": "user_upsert", "event_time": "2026-11-01T00:00:00Z",'
        ' "actor_id": 1}\n'
    )
    code, out, _ = recs("ingest", str(events))
    assert code == 0
    assert any(str(events) in line for line in out.splitlines()), out


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """(From a review.) SIGINT to a real ``recs generate-graph`` once it reports progress: exit
    130 (128 + SIGINT) and ``recs: aborted``, no traceback. Typer returns that code outside
    standalone mode, and ``main`` once dropped it for a 0, so a shell saw success."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "RECS_HOME": str(tmp_path)}
    env.pop("RECS_STORE_URL", None)
    command = [sys.executable, "-m", "recs.cli", "generate-graph", "--users", "400000"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        first = process.stderr.readline()  # its first progress line: main() is running
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=120)
    finally:
        process.kill()
    assert "generated" in first, first
    assert process.returncode == 130
    assert rest.strip().splitlines()[-1] == "recs: aborted"
    assert "Traceback" not in rest


@pytest.mark.slow
def test_sigterm_stops_a_command_with_its_clean_up(tmp_path):
    """(From a review.) SIGTERM to a real ``recs evaluate`` once it has made its throwaway folder
    (its first split's progress line): exit 143 (128 + SIGTERM) and ``recs: terminated``, no
    traceback, and the folder is gone. The signal killed the process outright, so the folder,
    a training store and its runs, stayed behind."""
    import os
    import signal
    import subprocess
    import sys

    rng = np.random.default_rng(5)
    follows = tmp_path / "follows.tsv"
    follows.write_text("".join(
        f"{a}\t{b}\n" for a in range(3000) for b in rng.choice(3000, 12, replace=False) if a != b
    ))  # fmt: skip
    scratch = tmp_path / "scratch"  # the throwaway folder's parent (TMPDIR)
    scratch.mkdir()
    env = {**os.environ, "RECS_HOME": str(tmp_path / "home"), "TMPDIR": str(scratch)}
    env.pop("RECS_STORE_URL", None)
    command = [sys.executable, "-m", "recs.cli", "evaluate", "--edges", str(follows),
               "--variants", "shipped", "--baselines", "global_popularity",
               "--out", str(tmp_path / "out")]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        seen = []
        while not any("split 1/" in line for line in seen):
            seen.append(process.stderr.readline())
            assert seen[-1], "".join(seen)  # it ended before its first split
        made = [p.name for p in scratch.iterdir() if p.name.startswith("recs-evaluate-")]
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=120)
    finally:
        process.kill()
    assert len(made) == 1, made
    assert process.returncode == 143, rest
    assert rest.strip().splitlines()[-1] == "recs: terminated"
    assert "Traceback" not in rest
    assert not (scratch / made[0]).exists()


def test_a_second_sigterm_does_not_cut_the_clean_up_short(monkeypatch):
    """(From a review.) A second SIGTERM while the first's clean-up runs (the ``finally`` of the
    command) raised again inside it and left the rest undone; it is now recorded and ignored.
    Real signals to this process, through the handler ``entry`` installs."""
    import os
    import signal
    import time

    from recs import cli

    monkeypatch.setattr(cli, "_signalled", [])
    previous = signal.signal(signal.SIGTERM, cli._raise_terminated)
    cleaned = []
    try:
        with pytest.raises(cli.Terminated):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)  # the handler raises before this returns
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up
                cleaned.append("after the second signal")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == ["after the second signal"]
    assert len(cli._signalled) == 2 and cli._signalled[1] is None  # received, ignored

    # past the grace, a SIGTERM raises again: the first may have been swallowed (a review's
    # landed in a __del__, which only prints an exception), and nothing but SIGKILL was left
    monkeypatch.setattr(cli, "TERM_GRACE_SECONDS", 0.0)
    signal.signal(signal.SIGTERM, cli._raise_terminated)
    try:
        with pytest.raises(cli.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("foo://bar", "no SQLAlchemy dialect 'foo'"),
        ("notaurl", "not a database URL (e.g. sqlite:////abs/path/live.db or "
                    "postgresql://user@host/db)"),
        ("mysql://someone:s3cret@127.0.0.1/x",
         "the driver of 'mysql' is not installed (no module 'MySQLdb')"),
    ],
)  # fmt: skip
def test_a_store_url_nothing_can_open_is_one_line(recs, monkeypatch, url, reason):
    """(From a review.) RECS_STORE_URL with an unknown scheme, no scheme, or a driver that is not
    installed: exit 2 and one line naming the setting and why, before anything runs; never the
    84-line SQLAlchemy traceback of the first query, never the password."""
    monkeypatch.setenv("RECS_STORE_URL", url)
    code, _, err = recs("run", "--snapshot-date", "2026-11-01")
    assert (code, err) == (2, [f"recs: error: invalid setting RECS_STORE_URL: {reason}"])
    monkeypatch.delenv("RECS_STORE_URL")
    monkeypatch.setenv("RECS_SNAPSHOT_STORE_URL", url)
    code, _, err = recs("run", "--snapshot-date", "2026-11-01")
    assert (code, err) == (2, [f"recs: error: invalid setting RECS_SNAPSHOT_STORE_URL: {reason}"])


def test_ctrl_c_during_dbt_stops_the_run_with_one_line(tmp_path):
    """SIGINT to a real ``recs run`` while dbt builds (dbt returns Ctrl-C as a failed result,
    printed a traceback, and the run went on reporting a build failure with no reason): exit
    130, ``recs: aborted``, no traceback, no stage after build_models."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "RECS_HOME": str(tmp_path)}
    env.pop("RECS_STORE_URL", None)
    recs = [sys.executable, "-m", "recs.cli"]
    generate = [*recs, "generate-graph", "--users", "3000", "--avg-out-degree", "10", "--replace"]
    subprocess.run(generate, env=env, check=True, capture_output=True)
    process = subprocess.Popen(
        [*recs, "run", "--snapshot-date", "2026-11-01"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    dbt_log = tmp_path / "runs" / "2026-11-01" / "cli__2026-11-01" / "dbt" / "logs" / "dbt.log"
    try:
        deadline = time.monotonic() + 60
        while not dbt_log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # dbt opens its log as its invocation starts: then it runs
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert dbt_log.exists() and "build_models" in rest, rest
    assert process.returncode == 130, rest
    assert rest.strip().splitlines()[-1] == "recs: aborted"
    assert "Traceback" not in rest and "build_graph" not in rest


def test_ctrl_c_inside_exec_of_a_source_string_still_exits_130(tmp_path):
    """CPython 3.11 marks a KeyboardInterrupt leaving ``exec`` of a source string (as dbt's
    dataclasses and mashumaro make their code) unhandled even when caught, and a process run
    with ``-m`` then ends by SIGINT: the flaky exit -2 of the test above, made deterministic."""
    import os
    import subprocess
    import sys

    (tmp_path / "interrupted_recs.py").write_text(
        "import recs.cli as cli\n"
        "def interrupted(*args, **kwargs):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "cli.app = interrupted\n"
        "cli.entry()\n"
    )
    path = os.pathsep.join([str(tmp_path), *sys.path])
    done = subprocess.run([sys.executable, "-m", "interrupted_recs"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": path})  # fmt: skip
    assert (done.returncode, done.stderr) == (130, "recs: aborted\n")


def _raises(error: BaseException):
    def command(*args, **kwargs):
        raise error

    return command


def _chained(error: Exception, cause: BaseException) -> Exception:
    try:
        raise error from cause
    except Exception as raised:
        return raised


def test_ctrl_c_reported_by_a_library_as_its_own_error_is_an_abort(monkeypatch, capsys):
    """(From a newcomer: 7 of 20 Ctrl-C's during loads, imports and freezes printed a traceback
    or blamed the store.) ADBC's SQLite driver raises NOT_IMPLEMENTED from the interrupt, the
    freeze wraps it in a LiveStoreError, DuckDB says "Query interrupted": each is exit 130 and
    ``recs: aborted``. A store error or a defect without an interrupt behind it is not."""
    import recs.cli as cli
    from recs.errors import LiveStoreError

    not_implemented = _chained(NotImplementedError("NOT_IMPLEMENTED"), KeyboardInterrupt())
    for error in (
        not_implemented,
        _chained(LiveStoreError("reading the live store failed: NOT_IMPLEMENTED"), not_implemented),
        RuntimeError("Query interrupted"),
    ):
        monkeypatch.setattr(cli, "app", _raises(error))
        assert cli.main([]) == 130
        assert capsys.readouterr().err == "recs: aborted\n"
    monkeypatch.setattr(cli, "app", _raises(LiveStoreError("reading the live store failed: x")))
    assert cli.main([]) == 2
    assert capsys.readouterr().err == "recs: error: reading the live store failed: x\n"
    monkeypatch.setattr(cli, "app", _raises(RuntimeError("a defect")))
    with pytest.raises(RuntimeError, match="a defect"):
        cli.main([])


def test_recs_run_ends_with_how_it_ended():
    """(From a newcomer: a finished ``recs run`` printed its stage times only.) One line: what
    was published, what CURRENT names, what the gate compared with; a backfill says where."""
    from recs.cli.nightly import _run_outcome

    def doc(current, previous, compared):
        publish = {"users": 54_936, "rows": 985_580, "current": current, "previous": previous}
        return {"run_id": "cli__2026-11-01", "stages": {
            "validate_run": {"result": {"compared_with": compared, "skipped": [] if compared
                             else [{"name": "users_change_within_bounds",
                                    "reason": "nothing is published yet"}]}},
            "publish_run": {"result": publish},
        }}  # fmt: skip

    assert _run_outcome(doc(True, None, None)) == (
        "published cli__2026-11-01: 54,936 users with lists, 985,580 rows; CURRENT now names it "
        "(was none); the gate compared with nothing (nothing is published yet)"
    )
    assert _run_outcome(doc(False, "cli__2026-11-05", "cli__2026-11-05")) == (
        "published cli__2026-11-01: 54,936 users with lists, 985,580 rows; CURRENT stays on "
        "cli__2026-11-05, a later snapshot; the gate compared with cli__2026-11-05"
    )  # the way to serve it is the publish's warning's (a newcomer read it twice)
    # a rerun of the published run id replaces its own version (a newcomer read "compared with"
    # the run itself)
    assert _run_outcome(doc(True, "cli__2026-11-01", "cli__2026-11-01")) == (
        "published cli__2026-11-01: 54,936 users with lists, 985,580 rows; CURRENT now names it "
        "(was cli__2026-11-01); the gate compared with cli__2026-11-01 (its own earlier "
        "publication, which this one replaced)"
    )


def test_serve_on_a_port_in_use_is_one_line_and_exit_2(recs):
    """(From a newcomer: uvicorn's raw bind error and exit 3, the exit of a failed gate.)"""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = recs("serve", "--host", "127.0.0.1", "--port", str(port))
    assert code == 2
    assert _one_error(err) == (
        f"recs: error: cannot serve on 127.0.0.1:{port}: Address already in use (another "
        "process holds the port? choose another with --port or RECS_API_PORT)"
    )


@pytest.mark.parametrize(
    ("host", "every"), [("203.0.113.77", "0.0.0.0"), ("2001:db8::77", "::")]
)
def test_serve_on_an_address_of_another_machine_says_so(recs, host, every):
    """(From a newcomer: `--host` with a foreign address was blamed on "another process holds
    the port".) Documentation addresses (RFC 5737, RFC 3849), unless this machine has one."""
    import errno
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError as error:
        if error.errno != errno.EADDRNOTAVAIL:
            pytest.skip(f"no {host} here to refuse: {error}")  # e.g. no IPv6 at all
    else:
        pytest.skip(f"{host} is an address of this machine")
    code, _, err = recs("serve", "--host", host, "--port", "8000")
    where = f"[{host}]" if ":" in host else host
    assert code == 2
    assert _one_error(err) == (
        f"recs: error: cannot serve on {where}:8000: Cannot assign requested address (not an "
        "address of this machine: give one of its own with --host or RECS_API_HOST, or "
        f"{every} for every interface)"
    )


def test_serve_help_gives_the_settings_defaults(recs):
    """(From a newcomer: "Default api_host.") Each default, as the settings have it."""
    from recs.config import Settings

    code, out, _ = recs("serve", "--help")
    text = " ".join(out.split())
    assert code == 0
    for option, name in (("host", "api_host"), ("port", "api_port"), ("workers", "api_workers")):
        default = Settings.model_fields[name].default
        assert f"(default {default}, RECS_{name.upper()})" in text, option


def test_recommend_limit_help_gives_the_settings_default(recs):
    """The help spells the default out (the CLI does not import the settings to start); it must
    be the setting's."""
    from recs.config import Settings

    code, out, _ = recs("recommend", "--help")
    default = Settings.model_fields["api_default_limit"].default
    assert code == 0 and f"(default {default}, RECS_API_DEFAULT_LIMIT)" in " ".join(out.split())


@pytest.mark.parametrize(
    ("host", "free"), [("", True), ("::1", False), ("nosuchhost.invalid", False)]
)
def test_check_port_takes_every_interface_and_spells_ipv6(host, free):
    """(From a review.) An empty host (every interface) is not probed; an IPv6 host is shown in
    brackets; a name that does not resolve is one line."""
    import socket

    from recs.errors import ConfigurationError
    from recs.serving.server import check_port

    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    with socket.socket(family) as holder:
        holder.bind(("::1" if host == "::1" else "127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        if free:
            check_port(host, port)
            return
        with pytest.raises(ConfigurationError) as raised:
            check_port(host, port)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert str(raised.value).startswith(f"cannot serve on {where}: ")


@pytest.mark.parametrize(
    ("port", "first", "hint"),
    [
        (80, "1024", "a port below net.ipv4.ip_unprivileged_port_start (1024) needs privileges: "
         "choose another with --port or RECS_API_PORT"),
        (8000, "1024", "not a privileged port here (net.ipv4.ip_unprivileged_port_start is "
         "1024): a security policy of this machine refused it (SELinux, AppArmor, a "
         "container's seccomp profile?)"),
        (8000, "9000", "a port below net.ipv4.ip_unprivileged_port_start (9000) needs "
         "privileges: choose another with --port or RECS_API_PORT"),
    ],
)  # fmt: skip
def test_a_refused_bind_blames_privileges_only_below_the_first_unprivileged_port(
    tmp_path, monkeypatch, port, first, hint
):
    """(A review's open item: EACCES always named the privileged ports, also where SELinux
    refused port 8000.) The bind refused as the kernel refuses it; the sysctl as read."""
    import errno
    import socket

    from recs.errors import ConfigurationError
    from recs.serving import server

    def refused(self, address):
        raise PermissionError(errno.EACCES, "Permission denied")

    sysctl = tmp_path / "ip_unprivileged_port_start"
    sysctl.write_text(f"{first}\n")
    monkeypatch.setattr(server, "UNPRIVILEGED_PORT_START", sysctl)
    monkeypatch.setattr(socket.socket, "bind", refused)
    with pytest.raises(ConfigurationError) as raised:
        server.check_port("127.0.0.1", port)
    assert str(raised.value) == f"cannot serve on 127.0.0.1:{port}: Permission denied ({hint})"


def test_check_port_probes_ipv6_as_uvicorn_binds_it():
    """(From a review.) Beside an IPv4 holder of the port, ``::`` is free for one worker
    (uvicorn binds IPv6 only through asyncio) and taken for several (its own dual-stack
    socket)."""
    import socket

    from recs.errors import ConfigurationError
    from recs.serving.server import check_port

    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        check_port("::", port, workers=1)
        with pytest.raises(ConfigurationError, match=rf"cannot serve on \[::\]:{port}: "):
            check_port("::", port, workers=2)


def test_a_run_that_rebuilt_its_snapshot_says_so(tmp_path):
    """(From a newcomer's run.) ``recs run --rebuild-snapshot`` printed nothing about the
    rebuild: one line now says it replaced the date's retained snapshot and what the cut-off
    left out (the snapshot manifest's counts; tables with none are not named). A reused or
    fresh snapshot gets no line."""
    import json

    from recs.cli.nightly import _rebuilt_note

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"excluded_after_cut_off": {"follow_edges": 1200,
                                                               "blocks": 0, "users": 1}}))
    assert _rebuilt_note({"source": "rebuilt", "manifest": str(manifest)}) == (
        "the snapshot was rebuilt from the live store as of its cut-off, replacing the date's "
        "retained one; left out as created after it: follow_edges 1,200, users 1"
    )
    manifest.write_text(json.dumps({"excluded_after_cut_off": {}}))
    assert _rebuilt_note({"source": "rebuilt", "manifest": str(manifest)}).endswith(
        "left out as created after it: nothing"
    )
    for source in ("retained", "live_store"):
        assert _rebuilt_note({"source": source, "manifest": str(manifest)}) is None


def test_dbt_docs_serve_checks_its_port_where_dbt_binds_it(monkeypatch, capsys):
    """(From a review.) The port is checked before the docs are generated, on ``DBT_HOST`` as
    ``dbt docs serve`` binds (127.0.0.1 without it): a port held on 127.0.0.2 passed the check
    on 127.0.0.1 and failed after ~13 s of generating. A port out of range is one line, exit 2
    (it was an ``OverflowError`` traceback)."""
    import socket

    from recs import cli
    from recs.cli.report import _refuse_port_in_use
    from recs.errors import RecsError

    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.delenv("DBT_HOST", raising=False)
        _refuse_port_in_use(port)  # free on 127.0.0.1
        monkeypatch.setenv("DBT_HOST", "127.0.0.2")
        with pytest.raises(RecsError, match=f"cannot serve the docs on port {port}: Address "):
            _refuse_port_in_use(port)
    assert cli.main(["dbt-docs", "--serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "recs: error: Invalid value for '--port': Input should be less than or equal to 65535"
    ]
