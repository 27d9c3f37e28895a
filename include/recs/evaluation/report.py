"""The evaluation's Markdown report and plot, from ``runner.evaluate``'s result documents.

``markdown(results)``: per dataset, the split, then one row per method (recall, precision,
NDCG, MRR @k, user and catalogue coverage, hub share, traversals per user, and recall of the
cold-start users apart) and the paired 95 % intervals of each product variant's recall against
the best baseline's and the design's; first a summary table of the shipped default against the
best baseline on every dataset. ``summary_rows`` gives that table's rows (the README copies it).
``plot(results, path)``: Altair, rendered to PNG or SVG by ``vl-convert`` offline: recall@k of
the baselines, the design and the shipped default per dataset, and each variant's recall
difference against the best baseline with its interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHIPPED = "shipped"
DESIGN = "design"


def _method(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((m for m in result["methods"] if m["name"] == name), None)


def _comparison(result, method: str, against: str | None, metric: str = "recall"):
    return next(
        (c for c in result["comparisons"]
         if c["method"] == method and c["against"] == against and c["metric"] == metric),
        None,
    )


def _interval(c) -> str:
    if c is None:
        return "–"
    return f"{c['mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"


def summary_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset: the shipped default's and the design's recall@k against the best baseline's,
    the paired interval of the shipped one's difference, coverage and traversals per user."""
    rows = []
    for result in results:
        best = _method(result, result["best_baseline"]) if result["best_baseline"] else None
        shipped, design = _method(result, SHIPPED), _method(result, DESIGN)
        if shipped is None:
            continue
        rows.append({
            "dataset": result["dataset"], "split": result["split"]["split"],
            "test_users": result["split"]["pooled_test_users"],
            "repeats": result["split"]["repeats"], "k": result["k"],
            "shipped": shipped["recall"], "design": design["recall"] if design else None,
            "best_baseline": result["best_baseline"],
            "baseline": best["recall"] if best else None,
            "vs_baseline": _comparison(result, SHIPPED, result["best_baseline"]),
            "user_coverage": shipped["user_coverage"],
            "traversals_per_user": shipped["traversals_per_user"],
            "design_traversals_per_user": design["traversals_per_user"] if design else None,
        })
    return rows


def summary_table(results: list[dict[str, Any]]) -> str:
    """The summary table (``summary_rows``) in Markdown."""
    lines = [
        "| dataset | split (test users) | recall@k shipped | design | best baseline | shipped − "
        "baseline [95 % CI] | user coverage | traversals/user (design) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in summary_rows(results):
        design = f"{row['design']:.4f}" if row["design"] is not None else "–"
        design_t = (f"{row['design_traversals_per_user']:,.0f}"
                    if row["design_traversals_per_user"] is not None else "–")
        lines.append(
            f"| {row['dataset']} | {row['split']}, {row['repeats']}× ({row['test_users']:,}) | "
            f"**{row['shipped']:.4f}** | {design} | {row['baseline']:.4f} "
            f"({row['best_baseline'].replace('_', ' ')}) | {_interval(row['vs_baseline'])} | "
            f"{row['user_coverage']:.1%} | {row['traversals_per_user']:,.0f} ({design_t}) |"
        )
    return "\n".join(lines)


def _dataset_section(result: dict[str, Any]) -> str:
    k = result["k"]
    split = result["split"]
    if split["split"] == "random":
        how = (f"random: {split['share']:.0%} of the follows of each user with at least "
               f"{split['min_follows']} hidden, seeds {', '.join(map(str, split['seeds']))}")
    else:
        how = (f"temporal: the follows after the {split['quantile']:.0%} quantile of the times "
               f"hidden ({split['later_edges_dropped_unknown_account']:,} of them to or from an "
               "account first seen after the cut dropped)")
    lines = [
        f"### {result['dataset']}",
        "",
        f"Split {how}; {split['pooled_test_users']:,} test users over {split['repeats']} "
        f"repeat(s), {split['train_edges']:,} training and {split['test_edges']:,} hidden "
        f"follows in the first; activity `{result['activity']}`; {result['seconds']:,.0f} s.",
        "",
        f"| method | recall@{k} | precision@{k} | NDCG@{k} | MRR@{k} | user coverage | "
        "catalogue coverage | hub share | traversals/user | cold-start users (recall) | "
        f"recall − {result['best_baseline']} [95 % CI] | recall − design [95 % CI] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in result["methods"]:
        cold = m.get("by_source", {}).get("cold_start")
        cold_text = f"{cold['users']:,} ({cold['recall']:.4f})" if cold and cold["users"] else "–"
        traversals = f"{m['traversals_per_user']:,.0f}" if "traversals_per_user" in m else "–"
        name = f"**{m['name']}**" if m["name"] == SHIPPED else m["name"]
        if m["kind"] == "baseline":
            name = f"_{name}_ (baseline)"
        lines.append(
            f"| {name} | {m['recall']:.4f} | {m['precision']:.4f} | {m['ndcg']:.4f} | "
            f"{m['mrr']:.4f} | {m['user_coverage']:.1%} | {m['catalogue_coverage']:.1%} | "
            f"{m['hub_share']:.1%} | {traversals} | {cold_text} | "
            f"{_interval(_comparison(result, m['name'], result['best_baseline']))} | "
            f"{_interval(_comparison(result, m['name'], DESIGN))} |"
        )
    lines.append("")
    described = [m for m in result["methods"] if m["kind"] == "product"]
    lines.append("Variants: " + "; ".join(
        f"`{m['name']}` {m['description']}" for m in described) + ".")
    return "\n".join(lines)


def markdown(results: list[dict[str, Any]], *, command: str = "", image: str | None = None) -> str:
    """The whole report (module docstring). ``command``: how it was produced; ``image``: the
    plot's file name, linked under the summary."""
    parts = ["# Recommendation quality on real graphs", ""]
    if command:
        parts += [f"Produced by `{command}`.", ""]
    parts += [summary_table(results), ""]
    if image:
        parts += [f"![recall@k per dataset]({image})", ""]
    parts += [
        "Intervals are paired percentile bootstraps over the test users (per-user recall of "
        "the two methods on the same users, users resampled with replacement); every test user "
        "counts, with zeros when they got no list. The method: "
        "`include/recs/evaluation/README.md`.",
        "",
    ]
    for result in results:
        parts += [_dataset_section(result), ""]
    return "\n".join(parts)


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    """Write the plot (module docstring) to ``path`` (``.png`` or ``.svg``, by vl-convert)."""
    import altair as alt
    import polars as pl

    levels, differences = [], []
    for result in results:
        for m in result["methods"]:
            if m["kind"] == "baseline" or m["name"] in (SHIPPED, DESIGN):
                levels.append({"dataset": result["dataset"], "method": m["name"],
                               "kind": m["kind"], "recall": m["recall"]})
        for c in result["comparisons"]:
            if c["against"] == result["best_baseline"] and c["metric"] == "recall" and (
                _method(result, c["method"])["kind"] == "product"
            ):
                differences.append({"dataset": result["dataset"], "variant": c["method"],
                                    "mean": c["mean"], "low": c["ci_low"], "high": c["ci_high"]})
    k = results[0]["k"] if results else 20
    bars = alt.Chart(pl.DataFrame(levels)).mark_bar().encode(
        x=alt.X("method:N", sort=None, title=None),
        y=alt.Y("recall:Q", title=f"recall@{k}"),
        color=alt.Color("kind:N", title=None),
    ).properties(width=180, height=160).facet(
        column=alt.Column("dataset:N", title=None)
    ).resolve_scale(y="independent")
    base = alt.Chart(pl.DataFrame(differences)).encode(y=alt.Y("variant:N", sort=None, title=None))
    whiskers = base.mark_rule().encode(
        x=alt.X("low:Q", title=f"recall@{k} − best baseline (95 % CI)"), x2="high:Q"
    )
    points = base.mark_point(filled=True).encode(x="mean:Q")
    zero = base.mark_rule(strokeDash=[4, 4], color="gray").encode(x=alt.datum(0))
    diff = (whiskers + points + zero).properties(width=180, height=320).facet(
        column=alt.Column("dataset:N", title=None)
    ).resolve_scale(x="independent")
    chart = alt.vconcat(bars, diff)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), scale_factor=1.5) if path.suffix == ".png" else chart.save(str(path))
    return path
