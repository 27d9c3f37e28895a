"""Airflow cluster policy of the Celery test's two workers only (``celery_stack.CeleryStack``
puts this folder on their ``PYTHONPATH``; no other process of the test loads it).

Each ``traverse_shard`` task, before it runs, records its worker in ``RECS_TEST_SHARD_MEETING``
(a folder of the stack's home) and waits until a shard task has started on another worker as
well, for at most ``MEETING_TIMEOUT`` seconds. The test checks that the shard tasks were spread
over both workers, and the shard tasks of its small graph take under a second: one worker could
take all four before the other had finished reporting the task it ran before them (seen once
in ``make test``: all four on ``recs-worker-b``). The wait makes the spread certain whenever both
workers take tasks, and changes nothing a task computes; a worker that never takes a shard
still fails the test, after the timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MEETING = "RECS_TEST_SHARD_MEETING"
MEETING_TIMEOUT = 60.0  # seconds


def task_policy(task) -> None:
    """Give ``traverse_shard`` (a mapped task: its unmapped operators take ``partial_kwargs``)
    the pre-execute hook ``meet``."""
    if task.task_id == "traverse_shard" and os.environ.get(MEETING):
        task.partial_kwargs["pre_execute"] = meet


def meet(context) -> None:
    """Record this worker; return once another worker has recorded itself, or at the timeout."""
    folder = Path(os.environ[MEETING])
    folder.mkdir(parents=True, exist_ok=True)
    me = os.environ["WORKER_HOSTNAME"]
    (folder / me).touch()
    deadline = time.monotonic() + MEETING_TIMEOUT
    while time.monotonic() < deadline:
        if any(path.name != me for path in folder.iterdir()):
            return
        time.sleep(0.1)
