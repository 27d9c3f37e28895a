"""Why ``make bench-ingest`` confines the snapshot standby to one CPU: what CPU work elsewhere
on this machine does to the primary's write latency, by scheduling class and placement.

A PostgreSQL primary holds a ``--users`` x 30 synthetic graph; the bench's writer
(``bench/ingest.py``'s ``WRITER``: single follow/unfollow events through
``recs.ingest.resolution.apply_events``, paced at 200/s) runs 7 s alone, then 7 s beside a "hog";
the p99 of each window and their ratio are printed per hog. The hogs are busy loops (or ``dd``), at
normal priority, at ``SCHED_IDLE`` (the kernel runs them only on CPU time nothing else wants), free
to use any CPU or pinned to the last one.

Measured on this 2-vCPU KVM machine (``.venv/bin/python bench/cpu_isolation.py``, 17:53 UTC,
another job using part of a core; ratio = p99 beside the hog / p99 alone): no hog 0.98; one
SCHED_IDLE loop free to move 2.38, the same loop pinned to the last CPU 0.85; two SCHED_IDLE
loops free 2.32, pinned 1.74; one normal-priority loop 1.14; ``dd`` of 500 MB at SCHED_IDLE
2.07 (with fsync) and 6.28 (page-cache writes without). So a lower priority alone does not
protect the primary here (a SCHED_IDLE task on a vCPU the primary's processes wake on next
still delays them; an earlier run gave 2.30 vs 1.03 for the first pair), while confining the
other work to one CPU does: the bench's standby and snapshot process run at SCHED_IDLE *and*
on the last CPU, the nearest this box gets to the separate host a production standby has.
Writing Parquet (page-cache writes) is the other way a snapshot can reach the primary on a
shared box; in production it happens on an Airflow worker.

Run: ``.venv/bin/python bench/cpu_isolation.py [hog ...]`` (about 20 s per hog, plus a 30 s
graph load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import WRITER, percentile, python_env  # noqa: E402 - bench/ingest.py

LAST_CPU = max(os.sched_getaffinity(0))
LOOP = "python3 -c 'while 1: pass'"
TWO_LOOPS = "python3 -c 'import os; os.fork(); exec(\"while 1: pass\")'"
HOGS = {
    "none": None,
    "idle_loop": f"chrt -i 0 {LOOP}",
    "idle_loop_pinned": f"taskset -c {LAST_CPU} chrt -i 0 {LOOP}",
    "idle_two_loops": f"chrt -i 0 {TWO_LOOPS}",
    "idle_two_loops_pinned": f"taskset -c {LAST_CPU} chrt -i 0 {TWO_LOOPS}",
    "normal_loop": LOOP,
    "idle_dd_fsync": "chrt -i 0 sh -c 'while true; do dd if=/dev/zero of={home}/big bs=1M "
    "count=500 conv=fsync status=none; done'",
    "idle_dd": "chrt -i 0 sh -c 'while true; do dd if=/dev/zero of={home}/big bs=1M count=500 "
    "status=none; rm {home}/big; done'",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hogs", nargs="*", help=f"Any of {', '.join(HOGS)} (default: all).")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=7.0, help="Per window.")
    args = parser.parse_args()
    unknown = sorted(set(args.hogs) - set(HOGS))
    if unknown:
        parser.error(f"unknown hog(s) {', '.join(unknown)}: choose from {', '.join(HOGS)}")
    args.hogs = args.hogs or list(HOGS)

    from recs.config import Settings
    from recs.demo.synthetic import generate_graph
    from recs.testing import pgserver

    home = Path(tempfile.mkdtemp(prefix="recs-cpu-isolation-"))
    server = pgserver.start(durable=True)
    try:
        url = server.create_database("graph")
        settings = Settings(home=home, store_url=url)
        generate_graph(args.users, 7, settings, avg_out_degree=30, replace=True)
        print(f"{'hog':24s} {'p50 alone':>9s} {'p99 alone':>9s} {'p50 hog':>8s} "
              f"{'p99 hog':>8s} {'ratio':>6s}")
        for name in args.hogs:
            stop = home / f"stop-{name}"
            writer = subprocess.Popen(
                [sys.executable, "-c", WRITER, url, str(args.users), "600", "200", "7", name,
                 str(stop)],
                stdout=subprocess.PIPE,
                text=True,
                env=python_env(),
            )
            time.sleep(args.seconds)
            hog_on = time.monotonic()
            command = HOGS[name]
            hog = (
                subprocess.Popen(command.format(home=home), shell=True, start_new_session=True)
                if command
                else None
            )
            time.sleep(args.seconds)
            hog_off = time.monotonic()
            if hog is not None:
                os.killpg(hog.pid, 9)
            stop.touch()
            samples = json.loads(writer.communicate(timeout=120)[0])
            warm = samples[0][0] + 1.0
            alone = [lat for t, lat in samples if warm <= t < hog_on]
            beside = [lat for t, lat in samples if hog_on <= t < hog_off]
            p99_alone, p99_beside = percentile(alone, 0.99), percentile(beside, 0.99)
            print(
                f"{name:24s} {1e3 * percentile(alone, 0.5):9.2f} {1e3 * p99_alone:9.2f} "
                f"{1e3 * percentile(beside, 0.5):8.2f} {1e3 * p99_beside:8.2f} "
                f"{p99_beside / p99_alone:6.2f}",
                flush=True,
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
