"""Run ``airflow dags test`` (or any command), keep its full output in a log, say each task's end.

Usage: python scripts/dag_progress.py LOG_FILE -- airflow dags test DAG_ID DATE

``make demo`` runs the nightly DAG through this: the DAG's own log goes to LOG_FILE (hundreds of
lines), and the terminal gets one line per task as it starts and ends, read from the
``[DAG TEST] starting task_id=… map_index=…`` / ``[DAG TEST] end task …`` lines Airflow's
``dag.test`` writes, with the seconds each took. Exits with the command's exit code; on failure
the log's last lines are printed. Standard library only.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

EVENT = re.compile(r"\[DAG TEST\] (starting|end task) task_id=(\S+) map_index=(-?\d+)")


MAPPED_OVER = {"validate_shards": "group", "cap_graph": "group"}
"""What a mapped task's index counts, where it is not a shard (the gate's groups of shards, the
graph's groups of partitions)."""


def label(task_id: str, map_index: str) -> str:
    """``traverse_shard[shard-003]``, ``validate_shards[group-001]``; the id of a task that is
    not mapped."""
    if map_index == "-1":
        return task_id
    return f"{task_id}[{MAPPED_OVER.get(task_id, 'shard')}-{int(map_index):03d}]"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    log_path, command = Path(argv[0]), argv[2:]
    started: dict[str, float] = {}
    tail: deque[str] = deque(maxlen=60)
    begun = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            tail.append(line)
            match = EVENT.search(line)
            if not match:
                continue
            kind, task_id, map_index = match.groups()
            name = label(task_id, map_index)
            now = time.monotonic()
            if kind == "starting":
                started[name] = now
                print(f"  {now - begun:7.1f} s  started   {name}", flush=True)
            else:
                seconds = now - started.get(name, now)
                print(f"  {now - begun:7.1f} s  finished  {name} ({seconds:.1f} s)", flush=True)
        code = process.wait()
    if code != 0:
        sys.stderr.write("".join(tail))
        sys.stderr.write(f"{' '.join(command)} exited {code} (full log: {log_path})\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
