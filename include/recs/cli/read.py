"""``recs recommend``, ``recs serve``, ``recs token``: the online read path from a shell."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from recs.cli.app import (
    ID_ARGUMENT,
    JsonOpt,
    UserIdArg,
    app,
    current_settings,
    emit,
    err,
    out,
    user_id_argument,
)
from recs.errors import RecsError


@app.command("recommend", context_settings=ID_ARGUMENT)
def recommend(
    user_text: UserIdArg,
    limit: Annotated[
        int | None,
        typer.Option("--limit", help="Items to show (default 20, RECS_API_DEFAULT_LIMIT)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """One user's who-to-follow list through the read path the API serves (batch list checked
    against the live store, or cold start), with score, mutual count and followed-by."""
    from recs.serving.live_store import LiveStore
    from recs.serving.read_path import parse_limit, wall_clock, who_to_follow
    from recs.serving.versions import load_current

    user_id = user_id_argument(user_text, "recommend")
    settings = current_settings()
    count = parse_limit(limit, settings)
    store = LiveStore(settings.live_store_url, timeout_ms=settings.api_store_timeout_ms)
    try:
        document = who_to_follow(
            user_id,
            count,
            version=load_current(settings),
            store=store,
            settings=settings,
            now=wall_clock(),
        )
    finally:
        store.close()

    def render(doc):
        if not doc["items"]:
            err.print(f"no account can be recommended to user {user_id} now", highlight=False)
            return
        why = f" ({doc['cold_start_reason']})" if doc.get("cold_start_reason") else ""
        table = Table(
            title=f"who to follow for user {user_id} — {doc['source']}{why}, "
            f"{doc['run_id'] or 'none'}"
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

    emit(document, as_json, render)


@app.command("serve")
def serve(
    host: Annotated[
        str | None,
        typer.Option("--host", help="Address to bind (default 127.0.0.1, RECS_API_HOST)."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", min=1, max=65535, help="Port to bind (default 8000, RECS_API_PORT)."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, max=64, help="uvicorn processes (default 1, RECS_API_WORKERS)."
        ),
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log", help="Log every request (costs throughput).")
    ] = False,
) -> None:
    """Serve the read API (uvicorn) from the published version CURRENT names and the live store;
    a new version is picked up without a restart. Needs RECS_API_JWT_SECRET."""
    from recs.serving.auth import secret_of
    from recs.serving.server import check_port
    from recs.serving.server import serve as _serve

    settings = current_settings()
    secret_of(settings)  # one-line error before anything starts if RECS_API_JWT_SECRET is unset
    host = host or settings.api_host
    port = port or settings.api_port
    workers = workers or settings.api_workers
    check_port(host, port, workers)  # a port in use: one line, exit 2, before the start-up
    err.print(
        f"recs read API on http://{f'[{host}]' if ':' in host else host}:{port} "
        f"({workers} worker{'s' if workers > 1 else ''}), "
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
    from recs.serving.auth import MAX_TTL_SECONDS, mint_token, secret_of

    user_id = user_id_argument(user_text, "token")
    if ttl is not None and not 1 <= ttl <= MAX_TTL_SECONDS:
        raise RecsError(f"invalid --ttl {ttl}: expected 1 to {MAX_TTL_SECONDS:,} seconds (30 days)")
    settings = current_settings()
    secret = secret_of(settings)
    ttl_seconds = settings.api_token_ttl_seconds if ttl is None else ttl
    sys.stdout.write(mint_token(secret, user_id, service=service, ttl_seconds=ttl_seconds) + "\n")
