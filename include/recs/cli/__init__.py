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
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from recs.errors import RecsError

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
RUN_ID_HELP = "1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit, no '..'"
RunIdOpt = Annotated[
    str | None,
    typer.Option(
        "--run-id", help=f"Run id (default: the only/newest run of that date); {RUN_ID_HELP}."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
# A user id is read as text and parsed by recs.auth.parse_id (canonical decimal, 0 .. 2**63-1),
# so `recs recommend -1` says what a user id is instead of "No such option: -1": commands
# taking one accept unknown option-like words as arguments (a mistyped option then shows up
# as "unexpected extra argument").
UserIdArg = Annotated[
    str, typer.Argument(help="User id: 0 .. 2**63-1, plain decimal.", metavar="USER_ID")
]
ID_ARGUMENT = {"ignore_unknown_options": True}


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
    from recs.datasets import GENERATED_FIELDS, refuse_non_empty_store
    from recs.datasets import load_dataset as _load

    settings = _settings()
    if not replace:
        refuse_non_empty_store(settings.live_store_url)
    summary = _load(name, settings, replace=replace, progress=_progress)

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
    from recs.datasets import refuse_non_empty_store
    from recs.synthetic import generate_graph as _generate

    settings = _settings()
    if not replace:
        refuse_non_empty_store(settings.live_store_url)
    summary = _generate(
        users,
        seed,
        settings,
        avg_out_degree=avg_out_degree,
        replace=replace,
        progress=_progress,
    )
    _emit(summary, as_json, lambda doc: _print_mapping("generated graph", doc))


@app.command("ingest")
def ingest(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Event files (.jsonl, .ndjson, .json, .gz, .parquet) or folders."),
    ] = None,
    landing: Annotated[
        bool,
        typer.Option(
            "--landing",
            help="Ingest the landing folder's new files and move them to landing/ingested/ "
            "(what the recs_ingest_events DAG runs).",
        ),
    ] = False,
    batch_events: Annotated[
        int | None, typer.Option("--batch-events", min=1, help="Events per transaction.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Apply follow/unfollow/block/... events to the live store: idempotent by event_id,
    last writer wins per relationship, bad lines quarantined (read = applied + duplicates +
    superseded + quarantined)."""
    from recs import ingest as _ingest

    settings = _settings()
    if landing == bool(paths):
        raise RecsError("give event files or folders to ingest, or --landing (not both)")
    batch_events = batch_events or _ingest.BATCH_EVENTS
    from recs.datasets import sqlite_file

    new_file = sqlite_file(settings.live_store_url)
    if new_file is not None and Path(new_file).exists():
        new_file = None
    if landing:
        result = _ingest.ingest_landing(settings, batch_events=batch_events, progress=_progress)
    else:
        result = _ingest.ingest_paths(
            paths or [], settings, batch_events=batch_events, progress=_progress
        )

    def render(doc):
        table = Table(title=f"ingested into {doc['store']} in {doc['seconds']:.1f} s")
        for column in ("file", "read", "applied", "duplicates", "superseded", "quarantined"):
            table.add_column(column, justify="left" if column == "file" else "right")
        for entry in [*doc["files"], {"path": "total", **doc}]:
            table.add_row(
                str(entry["path"]),
                *(
                    f"{entry[key]:,}"
                    for key in ("read", "applied", "duplicates", "superseded", "quarantined")
                ),
            )
        out.print(table)
        if doc["quarantine_reasons"]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in doc["quarantine_reasons"].items())
            err.print(f"quarantined by reason: {reasons} (table quarantined_events)")

    _emit(result, as_json, render)
    if new_file is not None:  # e.g. recs run outside the repository: RECS_HOME is relative
        err.print(
            f"note: there was no live store at {Path(new_file).resolve()}: a new one was "
            "created (set RECS_HOME or RECS_STORE_URL to use an existing store)",
            highlight=False,
        )


@app.command("reconcile")
def reconcile(
    repair: Annotated[
        bool, typer.Option("--repair", help="Replace drifted counts with the recomputed ones.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Recompute follower/following counts from the active follows and report drift against
    the maintained counts; exits 1 if drift remains (none, or repaired: 0)."""
    from recs.ingest import CountsDriftError, reconcile_counts

    report = reconcile_counts(_settings(), repair=repair)

    def render(doc):
        _print_mapping("follow counts", {k: v for k, v in doc.items() if k != "examples"})
        if doc["examples"]:
            table = Table(title="drifted users (first few)")
            for column in doc["examples"][0]:
                table.add_column(column, justify="right")
            for example in doc["examples"]:
                table.add_row(*(f"{value:,}" for value in example.values()))
            out.print(table)

    _emit(report, as_json, render)
    if report["users_drifted"] and not report["repaired"]:
        raise CountsDriftError(
            f"follow counts drifted for {report['users_drifted']:,} users: "
            "`recs reconcile --repair` recomputes them from the edges"
        )


@app.command("run")
def run(
    snapshot_date: SnapshotDate,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help=f"Default cli__<date>; {RUN_ID_HELP}.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the whole nightly pipeline in this process (the DAG's functions, without Airflow)."""
    from recs.pipeline import run_all
    from recs.runs import check_run_id

    if run_id is not None:
        check_run_id(run_id)  # refused, never rewritten: exit 2 before any stage starts
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

    settings = _settings()
    versions = list_versions(settings.published_dir)

    def render(doc):
        if not doc["versions"]:
            err.print(
                f"nothing published under {settings.published_dir.resolve()}: run `make demo` "
                "or `recs run`, or set RECS_HOME to your data directory",
                highlight=False,
            )
            return
        table = Table(title="published versions")
        for column in ("current", "run_id", "snapshot_date", "shards", "users", "rows"):
            table.add_column(column, overflow="fold")
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


@app.command("recommend", context_settings=ID_ARGUMENT)
def recommend(
    user_text: UserIdArg,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Items to show (default api_default_limit).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """One user's who-to-follow list through the read path the API serves (batch list checked
    against the live store, or cold start), with score, mutual count and followed-by."""
    from recs import serving
    from recs.auth import parse_id

    user_id = parse_id(user_text, "user id")
    settings = _settings()
    count = serving.parse_limit(limit, settings)
    store = serving.LiveStore(settings.live_store_url, timeout_ms=settings.api_store_timeout_ms)
    try:
        document = serving.who_to_follow(
            user_id,
            count,
            version=serving.load_current(settings),
            store=store,
            settings=settings,
            now=serving.wall_clock(),
        )
    finally:
        store.close()

    def render(doc):
        if not doc["items"]:
            err.print(f"no account can be recommended to user {user_id} now", highlight=False)
            return
        table = Table(
            title=f"who to follow for user {user_id} — {doc['source']}, {doc['run_id'] or 'none'}"
        )
        for column in ("rank", "candidate_id", "score", "mutual_count", "followed by"):
            table.add_column(column, justify="right" if column != "followed by" else "left")
        for item in doc["items"]:
            followed = ", ".join(str(i) for i in item["followed_by"]["ids"])
            others = item["followed_by"]["others"]
            if others > 0:
                followed += f" and {others} other{'s' if others > 1 else ''}"
            score = item["score"]
            table.add_row(
                str(item["rank"]),
                str(item["candidate_id"]),
                "" if score is None else f"{score:.4f}",
                str(item["mutual_count"]),
                followed,
            )
        out.print(table)

    _emit(document, as_json, render)


@app.command("serve")
def serve(
    host: Annotated[str | None, typer.Option("--host", help="Default api_host.")] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="Default api_port.")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, max=64, help="Default api_workers.")
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log", help="Log every request (costs throughput).")
    ] = False,
) -> None:
    """Serve the read API (uvicorn) from the published version CURRENT names and the live store;
    a new version is picked up without a restart. Needs RECS_API_JWT_SECRET."""
    from recs.api import serve as _serve
    from recs.auth import secret_of

    settings = _settings()
    secret_of(settings)  # one-line error before anything starts if RECS_API_JWT_SECRET is unset
    host = host or settings.api_host
    port = port or settings.api_port
    workers = workers or settings.api_workers
    err.print(
        f"recs read API on http://{host}:{port} ({workers} worker{'s' if workers > 1 else ''}), "
        f"serving {settings.published_dir}/CURRENT",
        highlight=False,
    )
    _serve(settings, host=host, port=port, workers=workers, access_log=access_log)


@app.command("token", context_settings=ID_ARGUMENT)
def token(
    user_text: UserIdArg,
    service: Annotated[
        bool,
        typer.Option("--service", help="Service role: may read any user's list and /metrics."),
    ] = False,
    ttl: Annotated[
        int | None,
        typer.Option(
            "--ttl",
            help="Lifetime in seconds, 1 .. 2592000 (30 days); default api_token_ttl_seconds.",
        ),
    ] = None,
) -> None:
    """Mint a bearer token for the read API from RECS_API_JWT_SECRET (local use and tests).
    The token's subject is USER_ID."""
    from recs.auth import MAX_TTL_SECONDS, mint_token, parse_id, secret_of

    user_id = parse_id(user_text, "user id")
    if ttl is not None and not 1 <= ttl <= MAX_TTL_SECONDS:
        raise RecsError(f"invalid --ttl {ttl}: expected 1 to {MAX_TTL_SECONDS:,} seconds (30 days)")
    settings = _settings()
    secret = secret_of(settings)
    ttl_seconds = settings.api_token_ttl_seconds if ttl is None else ttl
    sys.stdout.write(mint_token(secret, user_id, service=service, ttl_seconds=ttl_seconds) + "\n")


def _print_mapping(title: str, mapping: dict) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key")
    table.add_column("value")
    for key, value in mapping.items():
        if isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        elif isinstance(value, float):
            value = f"{value:,.3f}"
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
