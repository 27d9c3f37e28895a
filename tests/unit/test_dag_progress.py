"""``scripts/dag_progress.py`` (``make demo``'s task lines) on a stand-in command that prints the
``[DAG TEST]`` lines Airflow's ``dag.test`` writes: one line per task start and end, mapped
tasks named by what their index counts, the full output kept in the log, the exit code passed
through."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dag_progress.py"
STAND_IN = textwrap.dedent(
    """
    import sys
    for task, index in (
        ("cap_graph", 0), ("plan_shards", -1), ("traverse_shard", 3), ("validate_shards", 1)
    ):
        print(f"[DAG TEST] starting task_id={task} map_index={index}")
        print("noise of the task")
        print(f"[DAG TEST] end task task_id={task} map_index={index}")
    sys.exit(int(sys.argv[1]))
    """
)


def test_each_task_gets_a_start_and_an_end_line_and_the_log_keeps_everything(tmp_path):
    log = tmp_path / "dag.log"
    for code in (0, 3):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(log), "--",
             sys.executable, "-c", STAND_IN, str(code)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == code
        names = [line.split()[3] for line in done.stdout.splitlines()]  # "<t> s started <name>"
        assert names == [
            "cap_graph[group-000]", "cap_graph[group-000]",
            "plan_shards", "plan_shards",
            "traverse_shard[shard-003]", "traverse_shard[shard-003]",
            "validate_shards[group-001]", "validate_shards[group-001]",
        ]  # fmt: skip
        assert log.read_text().count("noise of the task") == 4
        assert (f"exited {code}" in done.stderr) == (code != 0)
