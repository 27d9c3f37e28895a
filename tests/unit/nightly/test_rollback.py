"""Rollback (recs.nightly.publish.rollback) and the publish history it reads.

Versions are test_validation's hand-built run published as ``night_1`` .. ``night_4``
(snapshots 2026-11-01 .. 04), each validated by the real gate.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading

import pytest
from test_validation import write_good_run

from recs.errors import (
    InvalidRunIdError,
    RecsError,
    RunNotFoundError,
    RunStoreError,
    SwitchError,
)
from recs.nightly import history
from recs.nightly.publish import publish_run, rollback
from recs.nightly.runs import RunPaths
from recs.nightly.validation import validate_run
from recs.published import check_version, current_version, version_manifest


def publish(home, run_id, day):
    paths, settings = write_good_run(home, run_id=run_id, snapshot_date=dt.date(2026, 11, day))
    validate_run(paths, settings)
    publish_run(paths, settings)
    return settings


@pytest.fixture
def three(tmp_path):
    """night_1, night_2, night_3 published in that order; night_3 is CURRENT."""
    home = tmp_path / "home"
    for day in (1, 2, 3):
        settings = publish(home, f"night_{day}", day)
    return settings


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A run store (a local folder) the process's settings name, caches cleared around it."""
    from recs.config import get_settings
    from recs.nightly import artifacts

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    yield artifacts.RunStore(url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()


def test_rollback_goes_to_the_version_before_current_then_further(three):
    published = three.published_dir
    assert rollback(three) == {"run_id": "night_2", "previous": "night_3", "changed": True}
    assert current_version(published) == "night_2"
    assert rollback(three)["run_id"] == "night_1"
    with pytest.raises(RunNotFoundError, match="night_1 replaced no version when it was published"):
        rollback(three)
    assert current_version(published) == "night_1"
    actions = [(e["action"], e["run_id"], e["previous"]) for e in history.events(published)]
    assert actions == [
        ("publish", "night_1", None),
        ("publish", "night_2", "night_1"),
        ("publish", "night_3", "night_2"),
        ("rollback", "night_2", "night_3"),
        ("rollback", "night_1", "night_2"),
    ]


def test_a_version_rolled_back_from_is_not_the_next_rollback_target(three):
    """night_3 was bad: rolled back to night_2, then night_4 is published. Rolling night_4
    back returns to night_2 (what night_4 replaced), never to night_3."""
    rollback(three)
    publish(three.home, "night_4", 4)
    assert history.predecessor(three.published_dir, "night_4") == "night_2"
    assert rollback(three)["run_id"] == "night_2"


def test_a_switch_that_failed_or_a_torn_append_leaves_the_rollback_target_right(three, monkeypatch):
    """(From reviews.) night_3 was rolled back from. night_4's publish fails as it switches
    CURRENT (a full disk): when the history was appended after the switch, such a failure lost
    what night_4 replaced, the retry recorded night_4 replacing itself, and the rollback went
    to night_3. Appended before the switch, the retry and the rollback are right. A retried
    rollback goes one version back, not two; an append torn mid-line loses no later event."""
    from recs.nightly import switch

    rollback(three)
    paths, settings = write_good_run(three.home, run_id="night_4",
                                     snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    validate_run(paths, settings)
    atomic_write = switch.atomic_write

    def full_disk(path, **kwargs):
        if path.name == "CURRENT":
            raise OSError(28, "No space left on device")
        return atomic_write(path, **kwargs)

    def full_history(*args, **kwargs):
        raise OSError(28, "No space left on device")

    published = three.published_dir
    with monkeypatch.context() as patch:  # the append fails: nothing is switched
        patch.setattr(history, "record", full_history)
        with pytest.raises(SwitchError, match="No space left.*still names night_2 .nothing was"):
            publish_run(paths, settings)
    assert current_version(published) == "night_2"
    with monkeypatch.context() as patch:  # the switch fails after the append
        patch.setattr(switch, "atomic_write", full_disk)
        with pytest.raises(SwitchError, match="No space left.*still names night_2, so run"):
            publish_run(paths, settings)
    assert current_version(published) == "night_2"
    assert publish_run(paths, settings)["previous"] == "night_2"  # the retry
    assert history.predecessor(published, "night_4") == "night_2"
    with monkeypatch.context() as patch:
        patch.setattr(switch, "atomic_write", full_disk)
        with pytest.raises(SwitchError, match="No space left.*still names night_4"):
            rollback(three)
    assert current_version(published) == "night_4"
    assert rollback(three)["run_id"] == "night_2"  # retried: not on to night_1
    with (published / history.HISTORY_FILE).open("a") as handle:
        handle.write('{"seq": 99, "action": "publ')  # an append cut off mid-line
    publish_run(paths, settings)
    assert history.events(published)[-1]["run_id"] == "night_4"
    assert history.predecessor(published, "night_4") == "night_2"


def test_a_switch_that_failed_after_its_rename_says_it_happened(three, monkeypatch, capsys):
    """(An open note.) A rollback from night_3 whose write of CURRENT fails after the rename
    (the folder's fsync: an I/O error) moved CURRENT to night_2, but raised as if nothing had
    happened, and the operator's retry went on to night_1. The error says CURRENT names night_2
    now and to check before running anything again; through the CLI, one line and exit 74."""
    from recs import cli
    from recs.config import get_settings
    from recs.files import atomic_write
    from recs.nightly import switch

    @contextlib.contextmanager
    def fsync_fails(path, **kwargs):
        with atomic_write(path, **kwargs) as handle:
            yield handle
        raise OSError(5, "Input/output error", str(path.parent))

    monkeypatch.setattr(switch, "atomic_write", fsync_fails)
    with pytest.raises(SwitchError) as raised:
        rollback(three)
    assert str(raised.value) == (
        f"could not make CURRENT name night_2: [Errno 5] Input/output error: "
        f"'{three.published_dir}'; CURRENT names night_2 now, but the switch may not survive a "
        "crash: check it with `recs runs` before running anything again (a plain `recs "
        "rollback` again would go one version further back)"
    )
    assert current_version(three.published_dir) == "night_2"
    monkeypatch.setenv("RECS_HOME", str(three.home))
    get_settings.cache_clear()
    try:
        assert cli.main(["rollback"]) == 74
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("recs: error: could not make CURRENT name night_1: [Errno 5] ")
    assert "CURRENT names night_1 now" in err[-1]

    @contextlib.contextmanager
    def moved_then_unreadable(path, **kwargs):  # (a review: read back as "nothing")
        with atomic_write(path, **kwargs) as handle:
            yield handle
        path.unlink()
        path.mkdir()  # reading it raises IsADirectoryError
        raise OSError(5, "Input/output error", str(path.parent))

    monkeypatch.setattr(switch, "atomic_write", moved_then_unreadable)
    with pytest.raises(SwitchError, match="night_2: .Errno 5.*CURRENT cannot be read back"):
        rollback(three, to="night_2")


def test_a_switch_that_failed_is_shown_as_failed_in_the_history(three, monkeypatch):
    """(A review's open item: the history said "made current: yes" for a switch that failed
    and was never retried.) A rollback whose write of CURRENT fails before the rename leaves
    its event, marked failed in the versions page; the retry's event is not, nor is an event
    after which CURRENT was changed by hand (it did take)."""
    from fastapi.testclient import TestClient

    from recs.nightly import switch
    from recs.report.versions import versions_report
    from recs.report.web import create_app

    published = three.published_dir

    def full_disk(path, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(switch, "atomic_write", full_disk)
        with pytest.raises(SwitchError):
            rollback(three)

    def shown():
        return [(e["action"], e["run_id"], e["previous"], e["failed"])
                for e in versions_report(published)["history"]]  # fmt: skip

    assert shown()[0] == ("rollback", "night_2", "night_3", True)  # CURRENT names night_3
    assert not any(failed for *_, failed in shown()[1:])
    client = TestClient(create_app(authorize_run=lambda dag_id: None,
                                   authorize_nightly=lambda: None, home=lambda: three.home))
    rows = client.get("/").text.split('id="history"')[1].split("</table>")[0].split("<tr>")[2:]
    assert "no: the switch failed" in rows[0] and "failed" not in "".join(rows[1:])
    rollback(three)  # the retry
    assert shown()[:2] == [
        ("rollback", "night_2", "night_3", False),
        ("rollback", "night_2", "night_3", True),
    ]
    (published / "CURRENT").write_text("night_1\n")  # by hand, outside any command
    rollback(three, to="night_3")
    assert shown()[:3] == [
        ("rollback", "night_3", "night_1", False),
        ("rollback", "night_2", "night_3", False),  # it did take: CURRENT moved by hand since
        ("rollback", "night_2", "night_3", True),
    ]


def test_ctrl_c_after_current_moved_says_so(three, monkeypatch, capsys, caplog):
    """(Two reviews'.) Ctrl-C after CURRENT's rename, as the folder is synced, or once
    ``write_current`` has returned and the command is finishing: `recs rollback` exits
    "aborted" (130), after a warning that CURRENT names the new version now, so a plain
    rollback is not simply run again. Ctrl-C before the rename, or during a publish of the
    version CURRENT names already, warns of nothing."""
    from recs import cli
    from recs.config import get_settings
    from recs.files import atomic_write
    from recs.nightly import publish as publish_module
    from recs.nightly import switch

    monkeypatch.setenv("RECS_HOME", str(three.home))
    get_settings.cache_clear()
    real_write_current = switch.write_current

    @contextlib.contextmanager
    def interrupted_after_rename(path, **kwargs):
        with atomic_write(path, **kwargs) as handle:
            yield handle
        raise KeyboardInterrupt

    def interrupted_before(path, **kwargs):
        raise KeyboardInterrupt

    def interrupted_once_returned(published_dir, run_id):
        real_write_current(published_dir, run_id)
        raise KeyboardInterrupt  # as if it came at the next bytecode

    def recs(*args: str) -> tuple[int, list[str]]:
        """Exit code and what the CLI says: its warnings (logged) and its stderr."""
        caplog.clear()
        with caplog.at_level("WARNING", logger="recs.nightly.switch"):
            code = cli.main(list(args))
        said = [f"WARNING {r.name}: {r.getMessage()}" for r in caplog.records]
        return code, said + [line for line in capsys.readouterr().err.splitlines() if line]

    def warned(now: str, began: str) -> list[str]:
        return [
            f"WARNING recs.nightly.switch: interrupted once CURRENT was switched: CURRENT names "
            f"{now} now (it named {began} when the command began); check it with `recs runs` "
            "before running anything again (a plain `recs rollback` again would go one version "
            "further back)",
            "recs: aborted",
        ]

    try:
        monkeypatch.setattr(switch, "atomic_write", interrupted_before)
        assert recs("rollback") == (130, ["recs: aborted"])
        assert current_version(three.published_dir) == "night_3"
        monkeypatch.setattr(switch, "atomic_write", interrupted_after_rename)
        assert recs("rollback") == (130, warned("night_2", "night_3"))
        assert current_version(three.published_dir) == "night_2"
        monkeypatch.setattr(switch, "atomic_write", atomic_write)
        monkeypatch.setattr(publish_module, "write_current", interrupted_once_returned)
        assert recs("rollback") == (130, warned("night_1", "night_2"))
        assert current_version(three.published_dir) == "night_1"
        # another process switched CURRENT meanwhile (this one waited for the lock): not this
        # command's switch, nothing to warn of (a review's)
        def switched_elsewhere(published_dir):
            (published_dir / "CURRENT").write_text("night_2\n")
            raise KeyboardInterrupt

        monkeypatch.setattr(publish_module, "publisher_lock", switched_elsewhere)
        assert recs("rollback") == (130, ["recs: aborted"])
        assert current_version(three.published_dir) == "night_2"
        monkeypatch.undo()
        monkeypatch.setenv("RECS_HOME", str(three.home))
        (three.published_dir / "CURRENT").write_text("night_1\n")
        monkeypatch.setattr(publish_module, "write_current", interrupted_once_returned)
        # published again: CURRENT named it before, nothing switched, nothing to warn of
        first = RunPaths(three.home, dt.date(2026, 11, 1), "night_1")
        first.snapshot_dir.mkdir(parents=True, exist_ok=True)  # the CLI finds a frozen run
        first.snapshot_manifest.write_text(json.dumps({"settings": three.model_dump(mode="json")}))
        assert recs("publish", "--snapshot-date", "2026-11-01") == (130, ["recs: aborted"])
    finally:
        get_settings.cache_clear()


def test_ctrl_c_once_the_run_store_has_the_switch_sets_it_back(three, tmp_path, monkeypatch):
    """(A review's.) Ctrl-C as the run store records the switch (after its write), before
    CURRENT moved: the store's record goes back to the version CURRENT still names, so the
    command can be run again (it was refused as from a stale copy of published/)."""
    from recs.config import get_settings
    from recs.nightly import artifacts

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    store = artifacts.RunStore(url)
    real_set = artifacts.RunStore.set_current

    def recorded_then_interrupted(self, run_id):
        real_set(self, run_id)
        if run_id == "night_2":
            raise KeyboardInterrupt

    try:
        rollback(three, to="night_3")  # the store records night_3
        with monkeypatch.context() as patch:
            patch.setattr(artifacts.RunStore, "set_current", recorded_then_interrupted)
            with pytest.raises(KeyboardInterrupt):
                rollback(three)
        assert current_version(three.published_dir) == store.current() == "night_3"
        assert rollback(three)["run_id"] == "night_2"  # run again: not refused
        assert current_version(three.published_dir) == store.current() == "night_2"
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_a_switch_killed_between_the_store_and_current_is_finished_by_a_retry(
    three, store
):
    """(An open item of earlier reviews.) A rollback killed (SIGKILL, for real) after the run
    store recorded night_2 and before CURRENT moved: the store and CURRENT disagree, which is
    how a stale copy of published/ looks, and every command was refused; the way out was
    `recs rollback --to night_3`. This published/ holds the switch it began (.switching), so
    the same rollback run again finishes it; a copy without it stays refused (test_commands'
    stale-copy test), and so does a switch made elsewhere since."""
    rollback(three, to="night_3")  # the store records night_3
    _killed_rollback(three.home)
    assert (store.current(), current_version(three.published_dir)) == ("night_2", "night_3")
    assert rollback(three) == {"run_id": "night_2", "previous": "night_3", "changed": True}
    assert store.current() == current_version(three.published_dir) == "night_2"
    store.set_current("night_1")  # another machine's switch since: not this one's
    with pytest.raises(RunStoreError, match="records CURRENT = night_1 while"):
        rollback(three)


def test_a_publish_killed_between_the_store_and_current_is_gated_and_finished_again(
    three, tmp_path, monkeypatch
):
    """(A review's.) `recs run` run again after its publish was killed between the run store's
    record (night_4) and CURRENT's write (night_3) validates again before it publishes: the
    gate compares with what CURRENT names here (night_3), the version the publish replaces,
    instead of erring as on a stale copy and leaving the run unpublishable; the publish then
    finishes the switch."""
    import os
    import signal
    import subprocess
    import sys

    from recs.config import get_settings
    from recs.nightly import artifacts

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    store = artifacts.RunStore(url)
    paths, settings = write_good_run(three.home, run_id="night_4",
                                     snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    killed_at_current = (
        "import datetime, os, signal\n"
        "from recs.config import Settings\n"
        "from recs.nightly import switch\n"
        "from recs.nightly.publish import publish_run\n"
        "from recs.nightly.runs import RunPaths\n"
        "def killed(path, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "switch.atomic_write = killed\n"
        f"settings = Settings.model_validate({settings.model_dump(mode='json')!r})\n"
        f"publish_run(RunPaths(settings.home, datetime.date(2026, 11, 4), 'night_4'), settings)\n"
    )
    try:
        rollback(three, to="night_3")  # the store records night_3
        assert validate_run(paths, settings)["compared_with"] == "night_3"
        done = subprocess.run([sys.executable, "-c", killed_at_current], env=dict(os.environ),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == -signal.SIGKILL, done.stderr
        assert (store.current(), current_version(three.published_dir)) == ("night_4", "night_3")
        assert validate_run(paths, settings)["compared_with"] == "night_3"
        assert publish_run(paths, settings)["previous"] == "night_3"
        assert store.current() == current_version(three.published_dir) == "night_4"
        assert not (three.published_dir / ".switching").exists()
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_a_switch_that_failed_and_set_the_store_back_is_not_finished_later(
    three, tmp_path, monkeypatch
):
    """(A review's.) A rollback to night_2 fails (a full disk) and sets the store back; then
    the served machine, a copy of this home, rolls back to night_2 itself. This home is a stale
    copy now: its rollback to night_2 is refused, though its history's last event is that very
    switch (the failed one)."""
    from recs.config import get_settings
    from recs.nightly import artifacts, switch

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    store = artifacts.RunStore(url)

    def full_disk(path, **kwargs):
        raise OSError(28, "No space left on device")

    try:
        rollback(three, to="night_3")
        with monkeypatch.context() as patch:
            patch.setattr(switch, "atomic_write", full_disk)
            with pytest.raises(SwitchError, match="still names night_3, so run the command"):
                rollback(three, to="night_2")
        assert store.current() == "night_3"
        store.set_current("night_2")  # the served machine's rollback
        with pytest.raises(RunStoreError, match="records CURRENT = night_2 while"):
            rollback(three, to="night_2")
        assert current_version(three.published_dir) == "night_3"
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def _killed_rollback(home, to: str | None = None) -> None:
    """A real ``recs.nightly.publish.rollback`` of ``home`` in a subprocess, SIGKILLed as it
    writes CURRENT (after the run store recorded the switch)."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from recs.nightly import switch\n"
        "def killed(path, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "switch.atomic_write = killed\n"
        "from recs.nightly.publish import rollback\n"
        f"rollback({str(home)!r}, {to!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_a_killed_switch_mending_a_damaged_current_or_given_up_is_judged_right(
    three, store
):
    """(A second review's.) A rollback --to night_2 that mends an empty CURRENT, killed after
    the store (recording nothing before) took night_2: run again, it finishes. A killed switch
    given up with `recs rollback --to <CURRENT>` (which records CURRENT in the store) is not
    finished later, once another machine's switch made this one stale."""
    (three.published_dir / "CURRENT").write_text("\n")  # damaged; the store records nothing
    _killed_rollback(three.home, "night_2")
    assert store.current() == "night_2"
    assert rollback(three, to="night_2")["run_id"] == "night_2"
    assert current_version(three.published_dir) == store.current() == "night_2"

    _killed_rollback(three.home, "night_1")
    assert (store.current(), current_version(three.published_dir)) == ("night_1", "night_2")
    assert rollback(three, to="night_2")["changed"] is False  # given up: recorded again
    assert store.current() == "night_2"
    store.set_current("night_1")  # another machine, served since, rolled back
    with pytest.raises(RunStoreError, match="records CURRENT = night_1 while"):
        rollback(three, to="night_1")


def test_a_switch_that_failed_with_a_run_store_sets_its_record_back(three, tmp_path, monkeypatch):
    """(From a review.) With a run store, the switch is recorded there first. When the write of
    CURRENT then fails before its rename, CURRENT still names night_3, and the store's record
    of night_2 is set back to night_3, so running the rollback again is not refused as from a
    stale copy; it goes to night_2. When the store cannot be set back, the error says how."""
    from recs.config import get_settings
    from recs.nightly import artifacts, switch

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    store = artifacts.RunStore(url)
    real_write, real_set = switch.atomic_write, artifacts.RunStore.set_current

    def full_disk(path, **kwargs):
        if path.name == "CURRENT":
            raise OSError(28, "No space left on device")
        return real_write(path, **kwargs)

    def store_once(self, run_id):
        if run_id != "night_2":
            raise RunStoreError("run store: cannot write CURRENT")
        real_set(self, run_id)

    try:
        rollback(three, to="night_3")  # records night_3 there (a deployment setting one)
        assert store.current() == "night_3"
        with monkeypatch.context() as patch:
            patch.setattr(switch, "atomic_write", full_disk)
            with pytest.raises(SwitchError, match="still names night_3, so run the command"):
                rollback(three)
            assert store.current() == "night_3"
            patch.setattr(artifacts.RunStore, "set_current", store_once)
            with pytest.raises(SwitchError) as raised:
                rollback(three)
            assert store.current() == "night_2"
            assert str(raised.value).endswith(
                "CURRENT still names night_3, but the run store records night_2 and could not "
                "be set back (run store: cannot write CURRENT): `recs rollback --to night_3` "
                "here records it, then run the command again"
            )
        assert rollback(three, to="night_3")["changed"] is False  # the mend the error gives
        assert store.current() == "night_3"

        def interrupted(path, **kwargs):  # Ctrl-C as CURRENT is written (a second review)
            raise KeyboardInterrupt

        def another_machine_meanwhile(path, **kwargs):
            real_set(store, "night_1")  # its switch, between ours to the store and to CURRENT
            return full_disk(path, **kwargs)

        for fault, recorded in ((interrupted, "night_3"), (another_machine_meanwhile, "night_1")):
            with monkeypatch.context() as patch:
                patch.setattr(switch, "atomic_write", fault)
                with pytest.raises((KeyboardInterrupt, SwitchError)):
                    rollback(three)
            assert store.current() == recorded  # set back, or the other machine's left alone
            assert current_version(three.published_dir) == "night_3"
        real_set(store, "night_3")
        assert rollback(three)["run_id"] == "night_2"
        assert current_version(three.published_dir) == store.current() == "night_2"
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_an_os_error_no_command_handles_is_one_line_and_exit_74(tmp_path, monkeypatch, capsys):
    """A full disk or a permission the machine refuses is the machine's, not a defect: `recs`
    prints one line (the error as the OS gave it) and exits 74 (EX_IOERR), no traceback."""
    from recs import cli
    from recs.config import get_settings
    from recs.nightly import publish as publishing

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "home" / "published"))

    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(publishing, "rollback", denied)
    get_settings.cache_clear()
    try:
        assert cli.main(["rollback"]) == 74
    finally:
        get_settings.cache_clear()
    assert capsys.readouterr().err == (
        f"recs: error: [Errno 13] Permission denied: '{tmp_path / 'home' / 'published'}'\n"
    )


def test_a_first_switch_that_failed_leaves_the_run_store_recording_none(
    three, tmp_path, monkeypatch
):
    """(A second review.) A run store that records nothing yet, and CURRENT damaged from
    outside (empty), or none at all (a first switch): `recs rollback --to night_2` fails as it
    writes CURRENT. The store's record, made first, goes back to none (a strict read-back of
    the damaged CURRENT left it on night_2, and every command after was refused as from a
    stale copy); the same command run again then works."""
    from recs.config import get_settings
    from recs.nightly import artifacts, switch

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    real_write = switch.atomic_write

    def full_disk(path, **kwargs):
        if path.name == "CURRENT":
            raise OSError(28, "No space left on device")
        return real_write(path, **kwargs)

    try:
        for damage, says in (("", "CURRENT cannot be read back"), (None, "still names nothing")):
            current = three.published_dir / "CURRENT"
            if damage is None:
                current.unlink()  # none at all, as before a first publish
            else:
                current.write_text(damage)
            with monkeypatch.context() as patch:
                patch.setattr(switch, "atomic_write", full_disk)
                with pytest.raises(SwitchError, match=says):
                    rollback(three, to="night_2")
            assert artifacts.RunStore(url).current() is None
            assert rollback(three, to="night_2")["run_id"] == "night_2"
            assert artifacts.RunStore(url).current() == "night_2"
            artifacts.RunStore(url).set_current("")  # as before the next case
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_rollback_to_a_named_version(three):
    assert rollback(three, to="night_1")["previous"] == "night_3"
    assert current_version(three.published_dir) == "night_1"
    assert rollback(three, to="night_1")["changed"] is False
    assert rollback(three.home, to="night_3")["run_id"] == "night_3"  # a RECS_HOME works too


def test_rollback_refuses_unknown_incomplete_and_invalid_versions(three):
    """Each refusal is one line, and CURRENT stays on night_3."""
    published = three.published_dir
    with pytest.raises(RunNotFoundError, match="cannot roll back to night_9: no published"):
        rollback(three, to="night_9")
    with pytest.raises(InvalidRunIdError):
        rollback(three, to="../night_1")
    (published / "night_1" / "shard_id=003" / "recommendations.parquet").unlink()
    with pytest.raises(RunNotFoundError, match="night_1: published version 'night_1' is inc"):
        rollback(three, to="night_1")
    manifest_path = published / "night_2" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["validation"]["success"] = False
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(RunNotFoundError, match="no passed validation") as raised:
        rollback(three)  # the default target, night_2, is refused too: no silent skipping
    assert "\n" not in str(raised.value)
    assert current_version(published) == "night_3"


@pytest.mark.parametrize(
    "text", ["", " \n", "night_2 night_3\n", "../night_1", "..", "bogus\n"]
)
def test_a_current_naming_no_version_is_refused_until_a_named_rollback_mends_it(
    three, text, caplog
):
    """(From an open note.) A CURRENT damaged from outside (empty, two names, a path, a name
    no version has: a newcomer's, which the gate took for "cannot be read" and skipped its
    change checks, and a publish recorded as its rollback target) is one line with the remedy
    for the gate, the publisher, a plain rollback and `recs gc`, never "nothing published";
    `recs runs` still lists the versions; `rollback --to` mends it."""
    from recs.errors import CorruptFileError, ValidationEngineError
    from recs.nightly.baseline import replaced_version
    from recs.nightly.retention import collect_garbage
    from recs.published import list_versions

    published = three.published_dir
    paths, settings = write_good_run(three.home, run_id="night_4",
                                     snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    validate_run(paths, settings)  # validated while CURRENT was sound
    (published / "CURRENT").write_text(text)
    remedy = (
        "names (no version|'bogus', which is not a published version) .* point it at one with "
        "`recs rollback --to RUN_ID`"
    )
    with pytest.raises(CorruptFileError, match=remedy) as raised:
        current_version(published)
    assert "\n" not in str(raised.value)
    with pytest.raises(CorruptFileError, match=remedy):
        replaced_version(published, 4, [0, 1, 2, 3])  # the gate's change checks compare with it
    with pytest.raises(CorruptFileError, match=remedy):
        publish_run(paths, settings)
    caplog.clear()
    with pytest.raises(ValidationEngineError, match=remedy):  # the gate errs, with the remedy
        validate_run(paths, settings)
    # said once, by the error (a newcomer read it twice: a log line above `recs: error`)
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == []
    with pytest.raises(CorruptFileError, match=remedy):
        rollback(three)
    with pytest.raises(CorruptFileError, match=remedy):
        collect_garbage(three, dry_run=True)
    assert current_version(published, strict=False) is None
    shaped = current_version(published, strict=False, require_folder=False)  # the read API's
    assert shaped == ("bogus" if text == "bogus\n" else None)
    assert [v["run_id"] for v in list_versions(published)] == ["night_1", "night_2", "night_3"]
    assert not any(v["is_current"] for v in list_versions(published))
    assert rollback(three, to="night_3") == {"run_id": "night_3", "previous": None,
                                              "changed": True}  # fmt: skip
    assert current_version(published) == "night_3"
    assert rollback(three)["run_id"] == "night_2"  # and the history still knows the order


def test_rollback_of_nothing_published(tmp_path):
    with pytest.raises(RunNotFoundError, match="nothing is published"):
        rollback(tmp_path / "home")


def test_without_a_history_the_snapshot_order_stands_in(three):
    """Versions published before the history existed: the one before by snapshot date."""
    (three.published_dir / history.HISTORY_FILE).unlink()
    assert rollback(three)["run_id"] == "night_2"


def test_a_torn_history_line_is_skipped(three):
    with (three.published_dir / history.HISTORY_FILE).open("a") as handle:
        handle.write('{"seq": 4, "action": "publ')
    assert history.predecessor(three.published_dir, "night_3") == "night_2"


def test_rollback_is_atomic_for_concurrent_readers(three):
    """Four threads resolve CURRENT and read its manifest (and check the version) while
    CURRENT is rolled back and forward 300 times: every read names a whole, complete version
    and gets that version's manifest; none sees a missing or partial one."""
    published = three.published_dir
    stop = threading.Event()
    seen: list[str] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                name = current_version(published)
                manifest = version_manifest(published, name)
                assert manifest["run_id"] == name
                assert check_version(published, name)["rows"] == 9
                seen.append(name)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for i in range(300):
            if i % 3 == 2:
                rollback(three, to="night_3")
            else:
                rollback(three)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:1]
    assert len(seen) > 100
    assert set(seen) <= {"night_1", "night_2", "night_3"} and len(set(seen)) >= 2
    assert not [p.name for p in published.iterdir() if p.name.endswith(".tmp")]


def test_a_publish_after_current_moved_since_the_gate_is_refused(three):
    """(From a newcomer.) night_4 is validated against night_3, then CURRENT is rolled back to
    night_2: publishing night_4 would replace night_2, which the gate never compared it with,
    so it is refused (one line) and nothing changes; validated again (against night_2), it is
    published. A backfill (night_0, 2026-10-31) validated against night_2 and published after
    CURRENT moved on is published beside it: it does not replace CURRENT, so it goes."""
    from recs.errors import ValidationFailedError

    published = three.published_dir
    paths, settings = write_good_run(three.home, run_id="night_4",
                                     snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    assert validate_run(paths, settings)["compared_with"] == "night_3"
    rollback(three)
    with pytest.raises(ValidationFailedError, match="validated against night_3, and CURRENT "
                       "now names night_2") as raised:  # fmt: skip
        publish_run(paths, settings)
    assert "\n" not in str(raised.value)
    assert current_version(published) == "night_2" and not (published / "night_4").exists()
    assert validate_run(paths, settings)["compared_with"] == "night_2"
    assert publish_run(paths, settings)["previous"] == "night_2"
    assert current_version(published) == "night_4"

    backfill, backfill_settings = write_good_run(three.home, run_id="night_0",
                                                 snapshot_date=dt.date(2026, 10, 31))  # fmt: skip
    validate_run(backfill, backfill_settings)
    rollback(three)  # CURRENT back to night_2
    assert publish_run(backfill, backfill_settings)["current"] is False
    assert current_version(published) == "night_2"


def test_a_republish_over_its_own_copy_goes_only_with_the_files_the_gate_saw(three):
    """(From a review.) night_3 is rolled back from; its shards are rerun smaller (user 4
    gone) and validated against night_2; then CURRENT is pointed at night_3 again. Publishing
    would replace night_3's copy by files the gate never compared with it: refused. After
    validating against night_3 it goes, and publishing it once more (identical) goes too."""
    from test_validation import GOOD_ROWS

    from recs.errors import ValidationFailedError

    published = three.published_dir
    rollback(three)
    paths, _ = write_good_run(three.home, run_id="night_3", snapshot_date=dt.date(2026, 11, 3))
    for path in paths.shards_dir.rglob("*"):
        if path.is_file():
            path.unlink()  # a rerun writes new files; the published copy keeps its own
    smaller = {k: v for k, v in GOOD_ROWS.items() if k != 1}
    paths, settings = write_good_run(three.home, run_id="night_3", rows=smaller,
                                     snapshot_date=dt.date(2026, 11, 3))  # fmt: skip
    assert validate_run(paths, settings)["compared_with"] == "night_2"
    rollback(three, to="night_3")
    with pytest.raises(ValidationFailedError, match="validated against night_2, and CURRENT "
                       "now names night_3"):  # fmt: skip
        publish_run(paths, settings)
    assert version_manifest(published, "night_3")["users"] == 5  # the old copy, untouched
    assert validate_run(paths, settings)["compared_with"] == "night_3"
    assert publish_run(paths, settings)["replaced"] == "replaced"
    assert publish_run(paths, settings)["replaced"] == "unchanged"


@pytest.mark.parametrize("summary_change", ["compared_with", "older_summary"])
def test_the_publish_checks_both_baselines_a_summary_names(three, summary_change):
    """(From a review.) ``compared_with`` must be CURRENT too (CURRENT read again between the
    two reads of the gate), and a summary saved before ``current_when_validated`` existed
    that compared with nothing is checked as "validated against nothing"."""
    from recs.errors import ValidationFailedError
    from recs.files import read_json, write_json

    paths, settings = write_good_run(three.home, run_id="night_4",
                                     snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    validate_run(paths, settings)
    summary_path = paths.validation_dir / "summary.json"
    summary = read_json(summary_path)
    if summary_change == "compared_with":
        summary["compared_with"], expected = "night_2", "night_2, night_3"
    else:
        del summary["current_when_validated"]
        summary["compared_with"], expected = None, "nothing"
    write_json(summary_path, summary)
    with pytest.raises(ValidationFailedError, match=f"validated against {expected}, and CURRENT "
                       "now names night_3"):  # fmt: skip
        publish_run(paths, settings)


def test_a_publish_after_current_was_republished_with_other_files_is_refused(three):
    """(From a review.) night_4 is validated against night_3; then night_3 itself is rerun
    smaller, validated against its copy and published again, under the same name. night_4's
    change checks judged it against the old night_3: refused, then validated again, it goes."""
    from test_validation import GOOD_ROWS

    from recs.errors import ValidationFailedError

    night_4, settings_4 = write_good_run(three.home, run_id="night_4",
                                         snapshot_date=dt.date(2026, 11, 4))  # fmt: skip
    assert validate_run(night_4, settings_4)["compared_with"] == "night_3"
    night_3 = RunPaths.create(three.home, dt.date(2026, 11, 3), "night_3")
    for path in night_3.shards_dir.rglob("*"):
        if path.is_file():
            path.unlink()
    night_3, settings_3 = write_good_run(
        three.home, run_id="night_3", snapshot_date=dt.date(2026, 11, 3),
        rows={k: v for k, v in GOOD_ROWS.items() if k != 1},
    )  # fmt: skip
    validate_run(night_3, settings_3)
    assert publish_run(night_3, settings_3)["replaced"] == "replaced"
    with pytest.raises(ValidationFailedError, match="night_3, the version CURRENT names, was "
                       "published again with other files"):  # fmt: skip
        publish_run(night_4, settings_4)
    assert current_version(three.published_dir) == "night_3"
    validate_run(night_4, settings_4)
    assert publish_run(night_4, settings_4)["previous"] == "night_3"


@pytest.mark.parametrize("summary", [{}, {"shards": []}, {"shards": [
    {"shard_id": 0, "status": "computed", "sha256": None}]}])  # fmt: skip
def test_a_republish_is_identical_only_over_a_computed_shard_with_its_digest(three, summary):
    """(From a review: ``all()`` over no shard was True.)"""
    from recs.nightly.publish import _identical_republish

    assert not _identical_republish(three.published_dir, "night_3", summary, "night_3")


def test_a_current_whose_folder_is_gone_is_mended_with_a_run_store(three, tmp_path, monkeypatch):
    """(A second review's.) With a run store that records night_3, night_3's folder goes:
    `rollback --to night_2`, the remedy every command gives, goes through (it was refused:
    the store's record was compared with "no CURRENT")."""
    import shutil

    from recs.config import get_settings
    from recs.nightly import artifacts

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    try:
        rollback(three, to="night_3")  # the store records night_3
        shutil.move(three.published_dir / "night_3", tmp_path / "night_3")
        with pytest.raises(RecsError, match="names 'night_3', which is not a published version"):
            rollback(three)
        assert rollback(three, to="night_2")["changed"] is True
        assert current_version(three.published_dir) == artifacts.RunStore(url).current()
        assert current_version(three.published_dir) == "night_2"
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def test_a_republish_that_cannot_write_current_says_nothing_was_switched(three, monkeypatch):
    """(A second review's.) CURRENT names night_3 already, and writing it fails: the error says
    nothing was switched, not that CURRENT "names night_3 now" and a rollback would go back."""
    from recs.nightly import switch

    def full_disk(path, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(switch, "atomic_write", full_disk)
    with pytest.raises(SwitchError) as raised:
        switch.write_current(three.published_dir, "night_3")
    assert str(raised.value) == (
        "could not write CURRENT, which names night_3 already (nothing was switched): [Errno 28] "
        "No space left on device; run the command again once it can be written"
    )


def test_a_mend_of_a_damaged_current_does_not_mark_the_first_publish_failed():
    """(A second review's.) A first publish (previous none), then CURRENT damaged and mended by
    `rollback --to`, whose event records previous none too: no evidence of a failed switch."""
    found = [
        {"action": "publish", "run_id": "first", "previous": None, "current": True},
        {"action": "rollback", "run_id": "first", "previous": None, "current": True},
    ]
    assert history.failed_switches(found, "first") == [False, False]
    failed = [*found, {"action": "publish", "run_id": "second", "previous": "first",
                       "current": True}]  # fmt: skip
    assert history.failed_switches(failed, "first") == [False, False, True]

