"""The ``recs`` command line (Typer).

Every command wraps the same ``recs.pipeline`` / ``recs.*`` function an Airflow task calls, with
the same run-scoped paths, so ``recs shard run --snapshot-date D --shard 17`` rewrites exactly the
bytes the DAG's ``traverse_shard`` task wrote for shard 17 of that run.

Output convention: results on stdout (``--json`` for one machine-readable JSON object), human
progress and messages on stderr. Any error a user can cause exits non-zero with one line
``recs: error: …`` on stderr, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from recs.errors import RecsError, UnknownUserError

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

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

SnapshotDate = Annotated[
    str, typer.Option("--snapshot-date", help="The run's snapshot date, YYYY-MM-DD.")
]
RunIdOpt = Annotated[
    str | None,
    typer.Option("--run-id", help="Run id (default: the only/newest run of that date)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _settings():
    from recs.config import get_settings

    return get_settings()


def _emit(document: Any, as_json: bool, render) -> None:
    if as_json:
        sys.stdout.write(json.dumps(document, default=str, sort_keys=True) + "\n")
    else:
        render(document)


def _progress(message: str) -> None:
    err.print(f"[dim]→ {message}[/dim]", highlight=False)


@app.command("load-dataset")
def load_dataset(
    name: Annotated[str, typer.Argument(help="slashdot, twitter-bofa or twitter-hershey.")],
    replace: Annotated[bool, typer.Option(help="Drop the live store's tables first.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Load a real graph from ../shared/datasets into the live store (fields it lacks generated)."""
    from recs.datasets import GENERATED_FIELDS
    from recs.datasets import load_dataset as _load

    summary = _load(name, _settings(), replace=replace, progress=_progress)

    def render(doc):
        err.print(
            f"generated (not in the dataset, deterministic seed): {', '.join(GENERATED_FIELDS)}",
            highlight=False,
        )
        _print_mapping(f"loaded {name}", doc)

    _emit(summary, as_json, render)


@app.command("generate-graph")
def generate_graph(
    users: Annotated[int, typer.Option("--users", min=10, help="Number of users.")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed.")] = 7,
    avg_out_degree: Annotated[int, typer.Option(min=1, help="Mean follows per user.")] = 50,
    replace: Annotated[bool, typer.Option(help="Drop the live store's tables first.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate a synthetic power-law follow graph into the live store."""
    from recs.synthetic import generate_graph as _generate

    summary = _generate(
        users,
        seed,
        _settings(),
        avg_out_degree=avg_out_degree,
        replace=replace,
        progress=_progress,
    )
    _emit(summary, as_json, lambda doc: _print_mapping("generated graph", doc))


@app.command("run")
def run(
    snapshot_date: SnapshotDate,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Default cli__<date>.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the whole nightly pipeline in this process (the DAG's functions, without Airflow)."""
    from recs.pipeline import run_all

    settings = _settings()
    result = run_all(settings.home, snapshot_date, run_id, settings, progress=_progress)

    def render(doc):
        table = Table(title=f"run {doc['run_id']} ({doc['snapshot_date']})")
        table.add_column("stage")
        table.add_column("seconds", justify="right")
        table.add_column("share", justify="right")
        for name, stage in doc["stages"].items():
            share = stage["seconds"] / doc["seconds"] if doc["seconds"] else 0.0
            table.add_row(name, f"{stage['seconds']:.2f}", f"{share:.0%}")
        table.add_row("total", f"{doc['seconds']:.2f}", "100%")
        out.print(table)

    _emit(result, as_json, render)


@shard_app.command("run")
def shard_run(
    snapshot_date: SnapshotDate,
    shard: Annotated[int, typer.Option("--shard", help="Shard id, 0..shard_count-1.")],
    run_id: RunIdOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun one shard of an existing run: same inputs, same bytes as the Airflow task."""
    from recs import pipeline
    from recs.runs import RunPaths

    paths = RunPaths.find(_settings().home, snapshot_date, run_id)
    result = pipeline.traverse_shard(paths, shard)
    _emit(result, as_json, lambda doc: _print_mapping(f"shard {shard:03d} of {paths.run_id}", doc))


@app.command("summary")
def summary(snapshot_date: SnapshotDate, run_id: RunIdOpt = None, as_json: JsonOpt = False) -> None:
    """What one run did: snapshot counts, exports, per-shard users, rows, traversals, seconds."""
    from recs.reporting import run_summary

    paths_doc = run_summary(_settings().home, snapshot_date, run_id)
    _emit(paths_doc, as_json, _render_summary)


@app.command("runs")
def runs(as_json: JsonOpt = False) -> None:
    """Published versions, their shard counts and rows, and which one is current."""
    from recs.published import list_versions

    versions = list_versions(_settings().published_dir)

    def render(doc):
        table = Table(title="published versions")
        for column in ("current", "run_id", "snapshot_date", "shards", "users", "rows"):
            table.add_column(column)
        for version in doc["versions"]:
            table.add_row(
                "*" if version.get("is_current") else "",
                str(version.get("run_id")),
                str(version.get("snapshot_date")),
                str(version.get("shard_count")),
                f"{version.get('users', 0):,}",
                f"{version.get('rows', 0):,}",
            )
        out.print(table)

    _emit({"versions": versions}, as_json, render)


@app.command("recommend")
def recommend(
    user_id: Annotated[int, typer.Argument(help="The user to recommend for.", min=0)],
    as_json: JsonOpt = False,
) -> None:
    """The published who-to-follow list of one user, with score, mutual count and followed-by."""
    from recs.published import current_version, recommendations_for

    settings = _settings()
    if not _user_exists(settings, user_id):
        raise UnknownUserError(f"unknown user {user_id}: not in the live store")
    version = current_version(settings.published_dir)
    frame = recommendations_for(settings.published_dir, user_id, version)
    items = [
        {
            "candidate_id": row["candidate_id"],
            "rank": row["rank"],
            "score": row["score"],
            "mutual_count": row["mutual_count"],
            "followed_by": list(row["followed_by"] or []),
        }
        for row in frame.iter_rows(named=True)
    ]
    generated_at = frame["generated_at"][0] if frame.height else None
    document = {
        "user_id": user_id,
        "source": "batch",
        "run_id": version,
        "generated_at": generated_at.isoformat() + "Z" if generated_at else None,
        "items": items,
    }

    def render(doc):
        if not doc["items"]:
            err.print(
                f"user {user_id} has no batch recommendations in {version} "
                "(not eligible tonight, or no friend-of-friend passed the filters)",
                highlight=False,
            )
            return
        table = Table(title=f"who to follow for user {user_id} — {version}")
        for column in ("rank", "candidate_id", "score", "mutual_count", "followed by"):
            table.add_column(column, justify="right" if column != "followed by" else "left")
        for item in doc["items"]:
            others = item["mutual_count"] - len(item["followed_by"])
            followed = ", ".join(str(i) for i in item["followed_by"])
            if others > 0:
                followed += f" and {others} other{'s' if others > 1 else ''}"
            table.add_row(
                str(item["rank"]),
                str(item["candidate_id"]),
                f"{item['score']:.4f}",
                str(item["mutual_count"]),
                followed,
            )
        out.print(table)

    _emit(document, as_json, render)


def _user_exists(settings, user_id: int) -> bool:
    from sqlalchemy import select

    from recs.store import engine_for, users

    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                select(users.c.user_id).where(users.c.user_id == user_id)
            ).first()
    except Exception as error:  # noqa: BLE001 - one readable line for any store failure
        raise RecsError(f"cannot read the live store {settings.live_store_url}: {error}") from None
    finally:
        engine.dispose()
    return row is not None


def _print_mapping(title: str, mapping: dict) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key")
    table.add_column("value")
    for key, value in mapping.items():
        if isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        table.add_row(str(key), str(value))
    out.print(table)


def _render_summary(doc: dict) -> None:
    _print_mapping(f"run {doc['run_id']} ({doc['snapshot_date']})", doc["totals"])
    table = Table(title="shards")
    for column in ("shard", "users_in", "with_recs", "rows", "traversals", "seconds"):
        table.add_column(column, justify="right")
    for shard in doc["shards"]:
        table.add_row(
            f"{shard['shard_id']:03d}",
            f"{shard.get('users_in', 0):,}",
            f"{shard.get('users_with_recommendations', 0):,}",
            f"{shard.get('rows', 0):,}",
            f"{shard.get('traversals', 0):,}",
            f"{shard.get('seconds', 0):.2f}",
        )
    out.print(table)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning every user-causable error into one line on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app(args=argv, standalone_mode=False)
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        sys.stderr.write("recs: aborted\n")
        return 130
    except typer.TyperException as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # bare `recs` or `recs shard`
            sys.stderr.write(error.format_message().rstrip() + "\n")
            return 2
        message = " ".join(error.format_message().split())
        sys.stderr.write(f"recs: error: {message}\n")
        return error.exit_code
    except RecsError as error:
        sys.stderr.write(f"recs: error: {error}\n")
        return error.exit_code
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        sys.stderr.write(f"recs: error: invalid setting {where}: {first.get('msg')}\n")
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
