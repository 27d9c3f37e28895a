"""The ``recs`` Typer application and what its commands share: options, output, progress.

Output convention: results on stdout (``--json`` for one machine-readable JSON object), human
progress and messages on stderr.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="recs",
    help="Who-to-follow data platform: load graphs, run the nightly pipeline, read results.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


shard_app = typer.Typer(help="Work on one shard of a run.", no_args_is_help=True)
app.add_typer(shard_app, name="shard")


out = Console(soft_wrap=True, markup=False)
"""stdout. No Rich markup anywhere: a path or a value holding ``[red]`` or ``[/]`` is printed as
it is (a ``[/]`` in a path was a ``MarkupError`` after the command had done its work)."""

err = Console(stderr=True, soft_wrap=True, markup=False)


SnapshotDate = Annotated[
    str, typer.Option("--snapshot-date", help="The run's snapshot date, YYYY-MM-DD.")
]


RUN_ID_HELP = "1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit, no '..'"


RunIdOpt = Annotated[
    str | None,
    typer.Option(
        "--run-id", help=f"Run id (default: the only/newest run of that date); {RUN_ID_HELP}."
    ),
]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


NewestDateOpt = Annotated[
    str | None,
    typer.Option(
        "--snapshot-date",
        help="The run's snapshot date, YYYY-MM-DD (default: the newest run's, or --run-id's).",
    ),
]
"""The date of a command that reads a run (``report``, ``summary``, ``dbt-docs``): optional,
``chosen_run`` finds the run without it; commands that change a run require ``SnapshotDate``."""


# A user id is read as text and parsed by recs.serving.auth.parse_id (canonical decimal, 0 ..
# 2**63-1), so `recs recommend -1` says what a user id is instead of "No such option: -1":
# commands taking one accept unknown option-like words as arguments (a mistyped option that
# leaves a word over is named by recs.cli._taken_as_argument, not as an "extra argument").
UserIdArg = Annotated[
    str, typer.Argument(help="User id: 0 .. 2**63-1, plain decimal.", metavar="USER_ID")
]


ID_ARGUMENT = {"ignore_unknown_options": True}


def argument_hint(name: str, command: list[str], given: str) -> str:
    """The hint after "No such option: --x" for an option named like a command's argument
    ``name``: how to give it instead, ``command`` (``["recs", "runs", "show"]``) then the value
    ``given``, quoted for a shell, or ``name`` when none was given (or it looks like an option)."""
    import shlex

    value = shlex.quote(given) if given and not given.startswith("-") else name
    return f"; {name} is an argument, not an option: {' '.join([*command, value])}"


def user_id_argument(text: str, command: str) -> int:
    """The USER_ID argument of ``recs <command>`` (``parse_id``); an unknown option with a value
    in its place (``--limt=5``, which ``ID_ARGUMENT`` lets through as the argument) is named as
    an option (``InvalidRequestError``, exit 2, one line), and ``--user-id=7`` with how to give
    the id instead."""
    from recs.errors import InvalidRequestError
    from recs.serving.auth import parse_id

    option, equals, value = text.partition("=")
    if option.startswith("--") and len(option) > 2 and equals:
        hint = ""
        if option[2:].replace("-", "_").lower() == "user_id":
            hint = argument_hint("USER_ID", ["recs", command], value)
        raise InvalidRequestError(" ".join(f"No such option: {option}{hint}".split()))
    return parse_id(text, "user id")


def current_settings():
    from recs.config import get_settings

    return get_settings()


def chosen_run(snapshot_date: str | None, run_id: str | None):
    """``_chosen_run``, with ``note_other_runs``."""
    paths = _chosen_run(snapshot_date, run_id)
    note_other_runs(paths, run_id)
    return paths


def note_other_runs(paths, run_id: str | None) -> None:
    """One stderr note when the run was picked without ``--run-id`` from a date holding other
    frozen runs. (A newcomer's run stopped by Ctrl-C became what every command of that date
    read, validated and published, without a word.)"""
    if run_id is not None:
        return
    from recs.nightly.runs import frozen_runs

    others = sorted(set(frozen_runs(paths.home, paths.snapshot_date)) - {paths.run_id})
    if others:
        err.print(
            f"recs: note: {paths.snapshot_date.isoformat()} has {len(others) + 1} runs; this is "
            f"{paths.run_id}, frozen last (--run-id picks another: {', '.join(others)})",
            highlight=False,
            soft_wrap=True,
        )


def _chosen_run(snapshot_date: str | None, run_id: str | None):
    """The run a reading command is about (``RunPaths``): the given one; without a date, the
    latest date holding a frozen run (of that id, if given), and there the run ``RunPaths.find``
    picks for that date (the one whose snapshot was frozen last), so a command gives the same
    run with the date as without it. Folders that are not dates or runs, and runs that never
    froze a snapshot, are passed over. With a run store, a run id this machine has not seen is
    looked up there (``artifacts.find_run`` pulls its snapshot manifest: a newcomer's second
    machine said "no run" of a run its ``recs shard run`` could rerun). Raises
    ``RunNotFoundError`` naming what to run or read instead, ``RunStoreError``."""
    from recs.errors import RunNotFoundError
    from recs.nightly.artifacts import find_run, run_store
    from recs.nightly.runs import RunPaths, check_run_id, run_dates

    settings = current_settings()
    home = settings.home
    if snapshot_date is not None:
        try:  # this machine's first: a run store away does not hide a run that is here
            return RunPaths.find(home, snapshot_date, run_id)
        except RunNotFoundError:
            if run_id is None:
                raise
            return find_run(home, snapshot_date, run_id)
    if run_id is not None:
        check_run_id(run_id)  # a glob of safe characters only
    frozen = run_dates(home, run_id)
    if frozen:
        return RunPaths.find(home, frozen[-1], run_id)
    store = run_store() if run_id is not None else None
    held = sorted(date for date, name in store.runs() if name == run_id) if store else []
    if held:  # a machine that has not seen the run: its snapshot manifest from the store
        return find_run(home, held[-1], run_id)
    if run_id is None:
        raise RunNotFoundError(
            f"no run under {home}/runs has frozen its snapshot: run `make demo` or `recs run "
            "--snapshot-date D` first"
        )
    started = run_dates(home, run_id, frozen=False)
    if started:  # its folder, not yet frozen (in progress, or refused): find says so
        return RunPaths.find(home, started[-1], run_id)
    if (settings.published_dir / run_id / "manifest.json").is_file():
        raise RunNotFoundError(
            f"no run {run_id} under {home}/runs: its folder is gone (`recs gc` removes "
            f"runs older than RECS_RUN_RETENTION_DAYS), its published version is not: "
            f"`recs runs show {run_id}` shows that"
        )
    raise RunNotFoundError(
        f"no run {run_id} under {home}/runs (`recs runs` lists the published ones)"
    )


def emit(document: Any, as_json: bool, render) -> None:
    if as_json:
        sys.stdout.write(json.dumps(document, default=str, sort_keys=True) + "\n")
    else:
        render(document)


def progress(message: str) -> None:
    err.print(f"→ {message}", style="dim", highlight=False)


def print_whole(table: Table) -> None:
    """Print ``table`` no narrower than its unbreakable content, even past a narrower terminal's
    width: a ``no_wrap`` column's longest cell, another's longest word (in screen cells, so wide
    characters count twice), each with its padding and border (3) plus the left border (1). A
    run id or a path is never folded or cut (it is copied into the next command), text still
    wraps at its spaces, and the terminal wraps the long lines instead."""
    from rich.cells import cell_len

    least = 1
    for column in table.columns:
        texts = [str(column.header), *(str(cell) for cell in column.cells)]
        pieces = texts if column.no_wrap else [word for text in texts for word in text.split()]
        least += max(map(cell_len, pieces), default=0) + 3
    width = out.width
    out.width = max(width, least)  # print(width=...) is capped at the terminal's width
    try:
        out.print(table)
    finally:
        out.width = width


def print_mapping(title: str, mapping: dict) -> None:
    from rich.text import Text

    table = Table(title=title, show_header=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value")  # wraps at its spaces; a path (one word) stays whole
    for key, value in mapping.items():
        # as they are: "[b]" is not markup
        table.add_row(Text(str(key)), Text(shown_value(str(key), value)))
    print_whole(table)


def shown_value(key: str, value: Any) -> str:
    """A value as a key/value table shows it: counts with thousands separators (not an id or a
    seed: ``seed 20261101``), floats to 3 places, None and empty lists as ``none``, booleans as
    ``yes`` / ``no``, lists and mappings as ``a, b`` / ``key value, ...``, a list's integers
    plain (they are ids: shard ``1000``, not ``1,000``; never Python's
    ``[]``, ``{'active': 79796}``, ``None`` or ``True``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        plain = key.endswith(("id", "seed")) or key.startswith("seed")
        return str(value) if plain else f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {shown_value(str(k), v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):  # ids, e.g. shard ids: 1000, never 1,000
        return ", ".join(
            str(v) if isinstance(v, int) and not isinstance(v, bool) else shown_value(key, v)
            for v in value
        ) or "none"
    return str(value)
