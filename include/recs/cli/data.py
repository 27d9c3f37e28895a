"""``recs load-dataset`` and ``recs generate-graph``: demo data into the live store."""

from __future__ import annotations

from typing import Annotated

import typer

from recs.cli.app import JsonOpt, app, current_settings, emit, err, print_mapping, progress

Replace = Annotated[bool, typer.Option(help="Drop the live store's tables first.")]


def _settings_for_load(replace: bool):
    """The settings, after refusing a non-empty live store unless ``replace`` (before any work:
    no minutes of parsing or generating only to be refused)."""
    from recs.store.bulk import refuse_non_empty_store

    settings = current_settings()
    if not replace:
        refuse_non_empty_store(settings.live_store_url)
    return settings


def _discard_snapshots(settings) -> list[str]:
    """After a load into an empty or replaced store: drop the retained snapshots of the store it
    replaced (``recs.nightly.retained.discard_all``), so no run reuses them."""
    from recs.nightly.retained import discard_all

    return discard_all(settings.home)


@app.command("load-dataset")
def load_dataset(
    name: Annotated[str, typer.Argument(help="slashdot, twitter-bofa or twitter-hershey.")],
    replace: Replace = False,
    as_json: JsonOpt = False,
) -> None:
    """Load a bundled real graph (datasets/) into the live store (fields it lacks generated)."""
    from recs.demo.datasets import dataset_spec
    from recs.demo.datasets import load_dataset as _load
    from recs.demo.generated import GENERATED_FIELDS

    dataset_spec(name)  # an unknown name first: it is the first thing to mend
    settings = _settings_for_load(replace)
    summary = _load(name, settings, replace=replace, progress=progress)
    summary["discarded_snapshots"] = _discard_snapshots(settings)

    def render(doc):
        err.print(
            f"generated (not in the dataset, deterministic seed): {', '.join(GENERATED_FIELDS)}",
            highlight=False,
        )
        print_mapping(f"loaded {name}", doc)

    emit(summary, as_json, render)


@app.command("generate-graph")
def generate_graph(
    users: Annotated[int, typer.Option("--users", min=10, help="Number of users.")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed.")] = 7,
    avg_out_degree: Annotated[int, typer.Option(min=1, help="Mean follows per user.")] = 50,
    replace: Replace = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate a synthetic power-law follow graph into the live store."""
    from recs.demo.synthetic import generate_graph as _generate

    settings = _settings_for_load(replace)
    summary = _generate(
        users,
        seed,
        settings,
        avg_out_degree=avg_out_degree,
        replace=replace,
        progress=progress,
    )
    summary["discarded_snapshots"] = _discard_snapshots(settings)
    emit(summary, as_json, lambda doc: print_mapping("generated graph", doc))
