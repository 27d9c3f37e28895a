"""A throwaway Airflow on a real CeleryExecutor, all on this machine, for the Celery test.

``CeleryStack`` starts, each in its own process group (its own session), with its output in
``<home>/logs/<name>.log``:

- **Redis** (Debian's ``redis-server``, or ``RECS_REDIS_SERVER``), the Celery broker, on a free
  localhost port, nothing persisted;
- ``airflow db migrate`` on the PostgreSQL database given (Airflow's metadata DB; the Celery
  result backend is the same database, Airflow's default), and the DuckDB writer pool;
- ``airflow api-server``: the UI/REST API and the **execution API** the workers' task processes
  call (``AIRFLOW__CORE__EXECUTION_API_SERVER_URL``) with the JWT the scheduler signs for each
  task (``AIRFLOW__API_AUTH__JWT_SECRET``, the same value in every process);
- ``airflow scheduler`` (its cron schedule off, ``[scheduler] use_job_schedule = False``, so the
  only runs are the ones a test triggers) and ``airflow dag-processor`` (parses ``dags/``);
- one ``airflow celery worker`` per name in ``workers``, each with ``--celery-hostname NAME``
  and ``--concurrency`` 1, recording ``NAME`` as the host of the tasks it runs
  (``celery_worker_hostname``: on one machine the FQDN would not tell them apart), with the
  cluster policy of ``celery_worker_settings/`` (the shard tasks wait to have started on both).

Every process shares ``RECS_HOME`` and ``AIRFLOW_HOME`` (task logs) on one disk: the shared
volume case of a multi-machine deployment (README, "Running it in Airflow"). ``stop()`` (also
on leaving the ``with`` block, whatever happened) sends SIGTERM to each group, SIGKILL to any
group still alive after ``grace`` seconds, reaps each process, then kills any process left
whose environment names this stack's ``AIRFLOW_HOME`` (a task process runs in a process group
of its own) and returns their descriptions: after a clean stop there are none.

By hand (prints the environment to run ``airflow`` / ``recs`` commands against it, stops on
Ctrl-C)::

    .venv/bin/python tests/integration/celery_stack.py --home /tmp/recs-celery
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from airflow_env import BIN, REPO, airflow_env

HERE = Path(__file__).resolve().parent
DAG_ID = "recs_who_to_follow_nightly"
DUCKDB_POOL = "recs_duckdb_writer"


class StackError(RuntimeError):
    """A process of the stack did not start, or died."""


def redis_server_binary() -> str | None:
    """``RECS_REDIS_SERVER``, else ``redis-server`` on ``PATH`` (``make redis-server``), or
    None."""
    return os.environ.get("RECS_REDIS_SERVER") or shutil.which("redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sqlalchemy_url(url: str) -> str:
    """A ``postgresql://`` URL with the psycopg (3) driver named: Airflow's sync and async
    engines both use it (psycopg is pinned; psycopg2 and asyncpg are not installed)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme.split('+', 1)[0]}+psycopg://{rest}"


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class CeleryStack:
    """Redis + Airflow (API server, scheduler, DAG processor, Celery workers) over ``home``.

    ``metadata_url``: an empty PostgreSQL database (``postgresql://...``) for Airflow's metadata.
    ``env`` extra variables for every process (``RECS_SHARD_COUNT`` ...).
    """

    home: Path
    metadata_url: str
    workers: tuple[str, ...] = ("recs-worker-a", "recs-worker-b")
    env: dict[str, str] = field(default_factory=dict)
    grace: float = 30.0
    services: list[Service] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.logs = self.home / "logs"
        self.redis_port = free_port()
        self.api_port = free_port()
        fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        database = sqlalchemy_url(self.metadata_url)
        self.base_env = airflow_env(self.home)
        self.base_env.update(
            AIRFLOW__CORE__EXECUTOR="CeleryExecutor",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=database,
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC=database,
            AIRFLOW__CELERY__BROKER_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            AIRFLOW__CELERY__RESULT_BACKEND=f"db+{database}",
            AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{self.api_port}",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=(
                f"http://127.0.0.1:{self.api_port}/execution/"
            ),
            # The secrets every component must agree on, given to each process (not left to
            # the airflow.cfg the first process happens to generate).
            AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(48),
            AIRFLOW__API__SECRET_KEY=secrets.token_urlsafe(48),
            AIRFLOW__CORE__FERNET_KEY=fernet_key,
            AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            **self.env,
        )

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> CeleryStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 300.0) -> None:
        """Start every process and wait until each is ready; raises ``StackError`` naming the
        one that died or did not get ready, with the end of its log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        redis = redis_server_binary()
        if redis is None:
            raise StackError("no redis-server: run `make redis-server` or set RECS_REDIS_SERVER")
        redis_dir = self.home / "redis"
        redis_dir.mkdir(exist_ok=True)
        self._spawn(
            "redis",
            [redis, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(redis_dir)],
        )  # fmt: skip
        self._wait("redis", self._redis_ready, timeout=30)
        self.airflow("db", "migrate", timeout=600)
        self.airflow("pools", "set", DUCKDB_POOL, "1", "one DuckDB writer at a time")
        self._spawn(
            "api-server",
            [str(BIN / "airflow"), "api-server", "--host", "127.0.0.1",
             "--port", str(self.api_port), "--workers", "1"],
        )  # fmt: skip
        self._spawn("scheduler", [str(BIN / "airflow"), "scheduler", "--skip-serve-logs"])
        self._spawn("dag-processor", [str(BIN / "airflow"), "dag-processor"])
        for name in self.workers:
            self._spawn(
                name,
                [str(BIN / "airflow"), "celery", "worker", "--celery-hostname", name,
                 "--queues", "default", "--concurrency", "1", "--skip-serve-logs"],
                extra={
                    "WORKER_HOSTNAME": name,
                    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "celery_worker_hostname.hostname",
                    # the workers' cluster policy: the shard tasks meet (its docstring says why)
                    "RECS_TEST_SHARD_MEETING": str(self.home / "shard-meeting"),
                    "PYTHONPATH": os.pathsep.join(
                        filter(None, [str(HERE), str(HERE / "celery_worker_settings"),
                                      self.base_env.get("PYTHONPATH")])
                    ),
                },
            )  # fmt: skip
        self._wait("api-server", self._api_ready, timeout)
        for name in self.workers:
            self._wait(name, lambda name=name: " ready." in self._log_text(name), timeout)
        self._wait("dag-processor", self._dag_parsed, timeout)

    def stop(self) -> list[str]:
        """Stop every process group (SIGTERM, then SIGKILL after ``grace`` s) and reap it; then
        kill any process still running in this stack's ``AIRFLOW_HOME``. Returns those."""
        for service in reversed(self.services):
            _signal_group(service.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        unreaped = []
        for service in reversed(self.services):
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            _signal_group(service.process, signal.SIGKILL)  # what is left of the group
            try:
                service.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                unreaped.append(f"{service.process.pid} {service.name} (not reaped)")
        self.services.clear()
        return unreaped + _kill_remaining(f"AIRFLOW_HOME={self.base_env['AIRFLOW_HOME']}")

    # --- commands --------------------------------------------------------------------------

    def airflow(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
        """Run one ``airflow`` command against the stack; raises with its output if it fails."""
        return run([str(BIN / "airflow"), *args], self.base_env, timeout=timeout)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows of one query on Airflow's metadata DB."""
        import psycopg

        with psycopg.connect(self.metadata_url, autocommit=True) as connection:
            return connection.execute(sql, params).fetchall()

    def wait_for_run(self, run_id: str, timeout: float) -> str:
        """Wait until the DAG run ends; returns its state (``success`` / ``failed``)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            rows = self.query(
                "select state from dag_run where dag_id = %s and run_id = %s", (DAG_ID, run_id)
            )
            state = rows[0][0] if rows else None
            if state in ("success", "failed"):
                return state
            if time.monotonic() > deadline:
                return f"{state} after {timeout:.0f} s"
            time.sleep(2)

    def task_instances(self, run_id: str) -> list[dict]:
        """``task_id, map_index, state, hostname, pid, try_number`` of every task instance."""
        rows = self.query(
            "select task_id, map_index, state, hostname, pid, try_number from task_instance "
            "where dag_id = %s and run_id = %s order by task_id, map_index",
            (DAG_ID, run_id),
        )
        keys = ("task_id", "map_index", "state", "hostname", "pid", "try_number")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def log_tails(self, characters: int = 3000) -> str:
        """The end of every process's log and of every task log, for a failure message."""
        parts = [f"--- {s.name} ---\n{self._log_text(s.name)[-characters:]}" for s in self.services]
        task_logs = sorted((self.home / "airflow" / "logs").glob("**/*.log"))
        parts += [f"--- {p} ---\n{p.read_text(errors='replace')[-characters:]}" for p in task_logs]
        return "\n".join(parts)

    # --- internals --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> None:
        log = self.logs / f"{name}.log"
        with log.open("ab") as output:
            process = subprocess.Popen(
                args,
                env={**self.base_env, **(extra or {})},
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group
            )
        self.services.append(Service(name, process, log))

    def _log_text(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _check_alive(self) -> None:
        for service in self.services:
            if service.process.poll() is not None:
                raise StackError(
                    f"{service.name} exited {service.process.returncode}:\n"
                    f"{self._log_text(service.name)[-4000:]}"
                )

    def _wait(self, name: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise StackError(
                    f"{name} not ready after {timeout:.0f} s:\n{self._log_text(name)[-4000:]}"
                )
            time.sleep(0.5)

    def _redis_ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _api_ready(self) -> bool:
        url = f"http://127.0.0.1:{self.api_port}/api/v2/monitor/health"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _dag_parsed(self) -> bool:
        try:
            return bool(self.query("select 1 from serialized_dag where dag_id = %s", (DAG_ID,)))
        except Exception:  # noqa: BLE001 - table not there yet, or the DB is busy: ask again
            return False


def run(args: list[str], env: dict[str, str], timeout: float = 600.0, check: bool = True):
    """One command, its output captured; raises ``AssertionError`` with it if it fails."""
    done = subprocess.run(
        args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
        )
    return done


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # start_new_session: its group id is its pid


def _kill_remaining(marker: str, timeout: float = 10.0) -> list[str]:
    """SIGKILL every process whose environment holds ``marker`` (``NAME=value``, exactly);
    returns ``"pid command"`` of each one found."""
    found = {}
    wanted = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if wanted not in environ:
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[int(entry.name)] = command.strip()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{pid} {command}" for pid, command in sorted(found.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="RECS_HOME/AIRFLOW_HOME parent")
    parser.add_argument("--shard-count", type=int, default=4)
    args = parser.parse_args()
    from recs.testing import pgserver

    postgres = pgserver.start(durable=False)
    try:
        url = postgres.create_database("airflow")
        env = {"RECS_SHARD_COUNT": str(args.shard_count)}
        with CeleryStack(args.home, url, env=env) as stack:
            for name, value in sorted(stack.base_env.items()):
                if name.startswith(("AIRFLOW", "RECS_", "DBT_")):
                    print(f"export {name}={shlex.quote(value)}")
            print(f"API server: http://127.0.0.1:{stack.api_port}  logs: {stack.logs}")
            print("running; Ctrl-C stops every process", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    stack._check_alive()
                    time.sleep(2)
            print(f"stopped; left over and killed: {stack.stop() or 'none'}")
    finally:
        postgres.stop()


if __name__ == "__main__":
    main()
