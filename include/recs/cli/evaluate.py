"""``recs evaluate``: recommendation quality of the product against classic baselines."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from recs.cli.app import JsonOpt, app, current_settings, emit, err, out, progress

DEFAULT_DATASETS = ("slashdot", "twitter-bofa", "twitter-hershey", "bitcoin-otc")


def _names(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option's names; None when not given, ``()`` for ``''`` (refused by
    ``EvaluationOptions.check``, not read as "all")."""
    return None if text is None else tuple(n.strip() for n in text.split(",") if n.strip())


@app.command("evaluate")
def evaluate(
    dataset: Annotated[list[str] | None, typer.Option(
        "--dataset", help="A bundled dataset (repeatable): slashdot, twitter-bofa, "
        "twitter-hershey, bitcoin-otc. Default: all four, unless --edges is given.")] = None,
    edges: Annotated[Path | None, typer.Option(
        "--edges", help="Your own edge list: 'follower followee [time]' per line.")] = None,
    reverse: Annotated[bool, typer.Option(help="--edges lines are 'followee follower'.")] = False,
    separator: Annotated[str | None, typer.Option(
        help="--edges column separator (default: tab, comma or space, detected).")] = None,
    time_column: Annotated[int | None, typer.Option(
        min=2, help="--edges 0-based column of each follow's time, epoch seconds.")] = None,
    split: Annotated[str, typer.Option(help="auto (temporal if every edge has a time), random "
                                            "or temporal.")] = "auto",
    activity: Annotated[str, typer.Option(
        help="auto (edges if timed), uniform or edges.")] = "auto",
    share: Annotated[float | None, typer.Option(help="Hidden share of each test user's follows "
                                                     "(RECS_EVAL_HOLDOUT_SHARE, 0.1).")] = None,
    min_follows: Annotated[int | None, typer.Option(
        help="Follows a test user needs, at least 2 (RECS_EVAL_MIN_FOLLOWS, 10).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (RECS_EVAL_SEED, 13).")] = None,
    temporal_quantile: Annotated[float | None, typer.Option(
        help="Temporal cut (RECS_EVAL_TEMPORAL_QUANTILE, 0.8).")] = None,
    k: Annotated[int | None, typer.Option("--k", min=1, help="List length scored (top_k).")] = None,
    variants: Annotated[str | None, typer.Option(
        help="Comma-separated ranking variants (recs.evaluation.variants; default all).")] = None,
    baselines: Annotated[str | None, typer.Option(
        help="Comma-separated baselines (default all five).")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write results.json, report.md and recall.png here.")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the throwaway homes (under --workdir).")] = False,
    workdir: Annotated[Path | None, typer.Option(help="Where the throwaway homes go.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hide a share of the follows, run the real pipeline on the rest, score the served top-k
    against the hidden ones, beside the classic baselines on the same split."""
    from recs.demo.datasets import dataset_spec
    from recs.evaluation.edges import dataset_edge_list, read_edge_list
    from recs.evaluation.report import markdown, plot, summary_table
    from recs.evaluation.runner import EvaluationOptions
    from recs.evaluation.runner import evaluate as run_evaluation

    settings = current_settings()
    options = EvaluationOptions.from_settings(
        settings, k=k, share=share, min_follows=min_follows, seed=seed,
        temporal_quantile=temporal_quantile, split=split, activity=activity,
        variants=_names(variants), baselines=_names(baselines), workdir=workdir, keep=keep,
    )
    # every option and dataset name before any work: a newcomer's second --dataset, unknown,
    # was refused only once the first had been evaluated
    options.check()
    names = dataset or (() if edges is not None else DEFAULT_DATASETS)
    for name in names:
        dataset_spec(name)
    sources = []
    if edges is not None:
        sources.append(lambda: read_edge_list(
            edges, separator=separator, reverse=reverse, time_column=time_column
        ))
    for name in names:
        sources.append(lambda name=name: dataset_edge_list(name, settings))
    results = [run_evaluation(load(), settings, options, progress=progress) for load in sources]
    command = "recs " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        image = plot(results, out_dir / "recall.png").name
        (out_dir / "report.md").write_text(markdown(results, command=command, image=image))
        err.print(f"wrote {out_dir}/report.md, recall.png, results.json", highlight=False)
    emit(results, as_json, lambda docs: out.print(summary_table(docs), highlight=False))
