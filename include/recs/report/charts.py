"""The report's charts as Vega-Lite specs (Altair), rendered in the browser by vega-embed.

Each function takes a section of ``recs.report.content.run_report`` (or the versions report)
and returns a Vega-Lite dict (``alt.Chart.to_dict()``, validated against the schema Altair
ships), or None when there is nothing to draw. Data go inline (``alt.Data(values=...)``): the
page makes no further request for them.
"""

from __future__ import annotations

from typing import Any

import altair as alt

from recs.report.content import STAGES

WIDTH = 560
STATUS_COLORS = {
    "within 2× median": "#4c78a8",
    "over 2× median": "#e45756",
    "carried_over": "#b0b0b0",
    "failed": "#7f3b08",
    "not run": "#dddddd",
}
GATE_COLORS = {"passed": "#54a24b", "failed": "#e45756", "errored": "#f58518"}


def stage_chart(stages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Stages on a time axis (seconds after the run's first start) when Airflow gave start and
    end times, else each stage's recorded seconds as a bar."""
    timed = [s for s in stages if s.get("seconds") is not None]
    if not timed:
        return None
    order = [s["stage"] for s in stages]
    if all(s.get("offset") is not None for s in timed):
        values = [
            {**_pick(s, "stage", "state", "seconds", "tries"), "from": s["offset"],
             "to": s["offset"] + s["seconds"]}
            for s in timed
        ]  # fmt: skip
        chart = (
            alt.Chart(alt.Data(values=values), title="Stage timings (from Airflow)")
            .mark_bar(height=14)
            .encode(
                x=alt.X("from:Q", title="seconds after the run started"),
                x2="to:Q",
                y=alt.Y("stage:N", sort=order, title=None),
                color=alt.Color("state:N", title="state"),
                tooltip=["stage:N", "state:N", alt.Tooltip("seconds:Q", format=".1f"), "tries:Q"],
            )
        )
    else:
        values = [_pick(s, "stage", "seconds") for s in timed]
        chart = (
            alt.Chart(alt.Data(values=values), title="Stage seconds (from the run's files)")
            .mark_bar(height=14)
            .encode(
                x=alt.X("seconds:Q", title="seconds"),
                y=alt.Y("stage:N", sort=list(STAGES), title=None),
                tooltip=["stage:N", alt.Tooltip("seconds:Q", format=".1f")],
            )
        )
    return chart.properties(width=WIDTH).to_dict()


def skew_chart(shards: list[dict[str, Any]], skew: dict[str, Any]) -> dict[str, Any] | None:
    """Traversals per shard against the median and the rebalance threshold (factor × median);
    a shard over it is red, shards not computed are grey stubs labelled with their status."""
    if not shards:
        return None
    values = []
    for shard in shards:
        if shard["status"] == "computed" and shard.get("traversals") is not None:
            flag = "over 2× median" if shard.get("skewed") else "within 2× median"
        else:
            flag = shard["status"]
        values.append(
            {
                "shard": f"{shard['shard_id']:03d}",
                "traversals": shard.get("traversals") or 0,
                "flag": flag,
                "ratio": shard.get("cost_ratio"),
                "seconds": shard.get("seconds"),
                "status": shard["status"],
            }
        )
    base = alt.Chart(alt.Data(values=values))
    bars = base.mark_bar().encode(
        x=alt.X("shard:O", title="shard", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("traversals:Q", title="traversals (second-hop expansions)"),
        color=alt.Color(
            "flag:N",
            title=None,
            scale=alt.Scale(domain=list(STATUS_COLORS), range=list(STATUS_COLORS.values())),
        ),
        tooltip=["shard:O", "status:N", "traversals:Q",
                 alt.Tooltip("ratio:Q", title="× median", format=".2f"),
                 alt.Tooltip("seconds:Q", format=".1f")],
    )  # fmt: skip
    layers: list[Any] = [bars]
    if skew.get("median_traversals") is not None:
        lines = [
            {"label": "median", "value": skew["median_traversals"]},
            {"label": f"{skew['factor']:g}× median", "value": skew["threshold"]},
        ]
        rules = (
            alt.Chart(alt.Data(values=lines))
            .mark_rule(strokeDash=[4, 3])
            .encode(
                y="value:Q",
                color=alt.value("#333333"),
                size=alt.value(1.5),
                tooltip=["label:N", "value:Q"],
            )
        )
        labels = (
            alt.Chart(alt.Data(values=lines))
            .mark_text(align="right", dx=-4, dy=-6, fontSize=11)
            .encode(y="value:Q", x=alt.value(WIDTH), text="label:N")
        )
        layers += [rules, labels]
    title = "Shard skew: traversal cost per shard (rebalance when one runs over 2× the median)"
    return alt.layer(*layers, title=title).properties(width=WIDTH, height=220).to_dict()


def hub_chart(shards: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per computed shard, its traversals through hub accounts and the rest, stacked."""
    values = []
    for shard in shards:
        hubs, total = shard.get("hub_traversals"), shard.get("traversals")
        if hubs is None or total is None:
            continue
        label = f"{shard['shard_id']:03d}"
        share = hubs / total if total else 0.0
        values.append({"shard": label, "kind": "through hubs", "traversals": hubs, "share": share})
        values.append({"shard": label, "kind": "other", "traversals": total - hubs, "share": share})
    if not values:
        return None
    chart = (
        alt.Chart(alt.Data(values=values), title="Hub traffic: traversals through hub accounts")
        .mark_bar()
        .encode(
            x=alt.X("shard:O", title="shard", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("traversals:Q", stack="zero", title="traversals"),
            color=alt.Color(
                "kind:N",
                title=None,
                scale=alt.Scale(domain=["through hubs", "other"], range=["#f58518", "#c7d5e8"]),
            ),
            order=alt.Order("kind:N", sort="descending"),
            tooltip=[
                "shard:O",
                "kind:N",
                "traversals:Q",
                alt.Tooltip("share:Q", title="hub share", format=".1%"),
            ],
        )  # fmt: skip
    )
    return chart.properties(width=WIDTH, height=200).to_dict()


def gate_chart(gate: dict[str, Any]) -> dict[str, Any] | None:
    """Expectations per checkpoint, stacked by passed / failed / errored."""
    values = []
    for checkpoint in gate.get("checkpoints", []):
        for status in GATE_COLORS:
            count = sum(e["status"] == status for e in checkpoint["expectations"])
            if count:
                values.append({"batch": checkpoint["batch"], "status": status, "count": count})
    if not values:
        return None
    chart = (
        alt.Chart(alt.Data(values=values), title="The gate: expectations per checkpoint")
        .mark_bar(height=14)
        .encode(
            y=alt.Y("batch:N", title=None, sort=[c["batch"] for c in gate["checkpoints"]]),
            x=alt.X("count:Q", stack="zero", title="expectations"),
            color=alt.Color(
                "status:N",
                title=None,
                scale=alt.Scale(domain=list(GATE_COLORS), range=list(GATE_COLORS.values())),
            ),
            tooltip=["batch:N", "status:N", "count:Q"],
        )
    )
    return chart.properties(width=WIDTH).to_dict()


def volume_chart(volume: dict[str, Any]) -> dict[str, Any] | None:
    """Relative change of users with lists and rows against the version compared with, between
    the gate's bounds (-max_drop .. +max_growth); None when nothing was compared."""
    values = [
        {"measure": m["measure"], "change": m["change"], "tonight": m["tonight"],
         "replaced": m["replaced"], "within": "within bounds" if m["within_bounds"] else "outside"}
        for m in volume.get("measures", []) if m.get("change") is not None
    ]  # fmt: skip
    if not values:
        return None
    drop, growth = volume.get("max_drop"), volume.get("max_growth")
    bars = (
        alt.Chart(alt.Data(values=values))
        .mark_bar(height=16)
        .encode(
            x=alt.X("change:Q", title="change against the version replaced",
                    axis=alt.Axis(format="%")),
            y=alt.Y("measure:N", title=None),
            color=alt.Color("within:N", title=None, scale=alt.Scale(
                domain=["within bounds", "outside"], range=["#54a24b", "#e45756"])),
            tooltip=["measure:N", "tonight:Q", "replaced:Q",
                     alt.Tooltip("change:Q", format="+.1%")],
        )
    )  # fmt: skip
    layers: list[Any] = [bars]
    if drop is not None and growth is not None:
        bounds = [
            {"bound": f"-{drop:.0%}", "value": -drop},
            {"bound": f"+{growth:.0%}", "value": growth},
        ]
        layers.append(
            alt.Chart(alt.Data(values=bounds))
            .mark_rule(strokeDash=[4, 3], color="#333333")
            .encode(x="value:Q", tooltip=["bound:N"])
        )
    title = f"Volume change against {volume.get('compared_with')}"
    return alt.layer(*layers, title=title).properties(width=WIDTH).to_dict()


def versions_chart(versions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Users with lists per published version, by snapshot date; the current one highlighted."""
    values = [
        {"run_id": v["run_id"], "snapshot_date": v["snapshot_date"], "users": v.get("users"),
         "rows": v.get("rows"), "role": v["role"]}
        for v in versions if v.get("users") is not None
    ]  # fmt: skip
    if not values:
        return None
    chart = (
        alt.Chart(alt.Data(values=values), title="Published versions: users with lists")
        .mark_bar()
        .encode(
            x=alt.X("run_id:N", title=None, sort=[v["run_id"] for v in reversed(versions)],
                    axis=alt.Axis(labelAngle=-30, labelLimit=220)),
            y=alt.Y("users:Q", title="users with lists"),
            color=alt.Color("role:N", title=None, scale=alt.Scale(
                domain=["current", "rollback target", "available"],
                range=["#54a24b", "#4c78a8", "#b0b0b0"])),
            tooltip=["run_id:N", "snapshot_date:N", "users:Q", "rows:Q", "role:N"],
        )
    )  # fmt: skip
    return chart.properties(width=WIDTH, height=180).to_dict()


def _pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: row.get(key) for key in keys}
