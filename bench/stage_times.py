"""Print each stage's wall time and share for one DAG run, from Airflow's own task records.

Usage: airflow tasks states-for-dag-run recs_who_to_follow_nightly DATE -o json \
           | python bench/stage_times.py
Mapped tasks (traverse_shard × S) are reported as one stage spanning first start to last end.
"""

from __future__ import annotations

import datetime as dt
import json
import sys


def main() -> int:
    """Read the JSON list of task instances on stdin; print a table on stdout."""
    text = sys.stdin.read()
    start = text.find("[")
    if start < 0:
        sys.stderr.write("stage_times: no task list on stdin\n")
        return 2
    records = json.loads(text[start:])
    spans: dict[str, list[dt.datetime]] = {}
    for record in records:
        if not record.get("start_date") or not record.get("end_date"):
            continue
        begin = dt.datetime.fromisoformat(record["start_date"])
        end = dt.datetime.fromisoformat(record["end_date"])
        span = spans.setdefault(record["task_id"], [begin, end])
        span[0], span[1] = min(span[0], begin), max(span[1], end)
    if not spans:
        sys.stderr.write("stage_times: no finished tasks\n")
        return 2
    first = min(begin for begin, _ in spans.values())
    last = max(end for _, end in spans.values())
    total = (last - first).total_seconds()
    print(f"{'stage':<18}{'seconds':>9}{'share':>8}")
    for task_id, (begin, end) in sorted(spans.items(), key=lambda item: item[1][0]):
        seconds = (end - begin).total_seconds()
        print(f"{task_id:<18}{seconds:>9.2f}{seconds / total:>8.0%}")
    print(f"{'pipeline (wall)':<18}{total:>9.2f}{1:>8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
