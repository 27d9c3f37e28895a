"""The nightly run with its artifacts on S3 (a real moto server) publishes the bytes of a local run.

One synthetic graph (600 users, generated relative to 2026-11-01) in one live store. First the
whole pipeline runs locally (``run_all``, no run store). Then the same snapshot date and run id
run with ``RECS_RUN_STORE_URL=s3://…`` on moto's S3-compatible server (``ThreadedMotoServer``,
on 127.0.0.1), every stage in another "machine": its own ``home``, sharing nothing with the
others but the bucket and the live store, as Celery workers on several hosts would. The
published recommendation files and the version manifest's checksums must equal the local
run's (whose graph was built in one process, here by partition on three machines); each
traverse machine memory-maps its one cached copy of the graph, never the run
folder's; the gate reuses every shard's saved result (the pulled files keep the writer's
mtimes, so the input fingerprints agree).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from recs.config import Settings, get_settings
from recs.nightly import artifacts, pipeline
from recs.nightly.runs import RunPaths
from recs.published import shard_file, version_manifest

pytestmark = pytest.mark.slow

DATE = "2026-11-01"
RUN_ID = "store_parity"
SHARDS = 3
BUCKET = "recs-runs"


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on a free loopback port with one bucket; AWS credentials and the
    endpoint (through ``RECS_RUN_STORE_OPTIONS``) set for the run store."""
    boto3 = pytest.importorskip("boto3")
    server_module = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    monkeypatch.setattr(logging.getLogger("werkzeug"), "level", logging.WARNING)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


def _use_store(monkeypatch, url: str | None, endpoint: str | None = None) -> None:
    if url is None:
        monkeypatch.delenv("RECS_RUN_STORE_URL", raising=False)
        monkeypatch.delenv("RECS_RUN_STORE_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("RECS_RUN_STORE_URL", url)
        monkeypatch.setenv("RECS_RUN_STORE_OPTIONS", f'{{"endpoint_url": "{endpoint}"}}')
    get_settings.cache_clear()
    artifacts._open.cache_clear()


def test_a_night_on_s3_across_machines_publishes_the_local_bytes(s3, tmp_path, monkeypatch, caplog):
    from recs.demo.synthetic import generate_graph

    monkeypatch.setenv("DBT_PROFILES_DIR", str(Path(__file__).resolve().parents[2] / "dbt_project"))
    local = Settings(home=tmp_path / "local", shard_count=SHARDS)
    generate_graph(600, 7, local, avg_out_degree=12)
    live = local.live_store_url
    try:
        _use_store(monkeypatch, None)
        pipeline.run_all(local.home, DATE, RUN_ID, local)

        _use_store(monkeypatch, f"s3://{BUCKET}/nightly", s3)

        def on(name: str) -> RunPaths:
            return RunPaths.create(tmp_path / name, DATE, RUN_ID)

        settings = Settings(home=tmp_path / "m1", store_url=live, shard_count=SHARDS)
        pipeline.freeze_snapshot(on("m1"), settings)
        pipeline.build_models(on("m2"))
        # the graph by partition, as the DAG's mapped tasks build it, on three machines
        assert pipeline.plan_graph(on("m3")) == [[0, 1, 2]]
        pipeline.cap_graph(on("m4"), [0, 2])
        pipeline.cap_graph(on("m1"), [1])
        pipeline.assemble_graph(on("m3"))
        assert pipeline.plan_shards(on("m1")) == list(range(SHARDS))
        traverse_on = {0: "m2", 1: "m4", 2: "m2"}
        for shard_id, name in traverse_on.items():
            pipeline.traverse_shard(on(name), shard_id)
        assert pipeline.gate_groups(on("m5"), list(range(SHARDS))) == [[0, 1, 2]]
        pipeline.validate_shards(on("m3"), [0])  # groups on machines that have not seen them
        pipeline.validate_shards(on("m1"), [1, 2])
        with caplog.at_level(logging.INFO, logger="recs.nightly.validation"):
            pipeline.validate_run(on("m4"))
        pipeline.publish_run(on("m5"))
    finally:
        _use_store(monkeypatch, None)

    assert "(0 validated here)" in caplog.text
    for name in set(traverse_on.values()):
        machine = on(name)
        # mapped from the machine's cache, not pulled into the run folder
        assert not (machine.graph_dir / "indices.npy").exists()
        cached = list((tmp_path / name / "cache" / "graphs" / DATE / RUN_ID).iterdir())
        copies = [p for p in cached if p.is_dir()]
        assert len(copies) == 1 and (copies[0] / "graph" / "indices.npy").is_file()
        assert sorted(p.name for p in cached if not p.is_dir()) == [
            ".lock", f"{copies[0].name}.inuse"  # no task holds it now: the next download may go
        ]

    # the publish writes under the home of the machine it runs on (m5), not the one frozen
    # into the run's settings (freeze_snapshot's, m1); its inputs came to m5 from the store
    published_local, published_s3 = local.published_dir, tmp_path / "m5" / "published"
    assert not (tmp_path / "m1" / "published").exists()
    assert (on("m5").shards_dir / "shard_id=001" / "recommendations.parquet").is_file()
    assert (published_s3 / "CURRENT").read_text().strip() == RUN_ID
    for shard_id in range(SHARDS):
        expected = shard_file(published_local, RUN_ID, shard_id).read_bytes()
        assert shard_file(published_s3, RUN_ID, shard_id).read_bytes() == expected
    local_manifest = version_manifest(published_local, RUN_ID)
    s3_manifest = version_manifest(published_s3, RUN_ID)
    assert local_manifest["rows"] > 1000
    assert [s["sha256"] for s in s3_manifest["shards"]] == [
        s["sha256"] for s in local_manifest["shards"]
    ]
    assert s3_manifest["exports"] == local_manifest["exports"]


def test_a_missing_bucket_or_an_unreachable_endpoint_is_one_line(s3, tmp_path):
    """A bucket that does not exist, and an endpoint nothing listens on: ``RunStoreError`` with
    one line naming the store and what failed, never a bare botocore error."""
    from recs.errors import RunStoreError
    from recs.nightly.artifacts import SNAPSHOT, RunStore

    paths = RunPaths.create(tmp_path / "m", DATE, RUN_ID)
    (paths.snapshot_dir).mkdir(parents=True)
    paths.snapshot_manifest.write_text("{}")
    missing = RunStore("s3://no-such-bucket/runs", {"endpoint_url": s3})
    with pytest.raises(RunStoreError, match=r"no-such-bucket.*cannot list snapshot: not found"):
        missing.push(paths, SNAPSHOT)
    with pytest.raises(RunStoreError, match="no-such-bucket does not exist: create the bucket"):
        missing.check()  # what every task does first (``artifacts.run_store``)
    RunStore(f"s3://{BUCKET}/a-prefix-not-written-yet", {"endpoint_url": s3}).check()
    closed = RunStore(
        f"s3://{BUCKET}/runs",
        {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"max_attempts": 1}}},
    )
    with pytest.raises(RunStoreError, match="cannot reach it: EndpointConnectionError") as error:
        closed.check()
    assert "\n" not in str(error.value)


def test_an_endpoint_that_never_answers_fails_in_bounded_time(tmp_path, monkeypatch):
    """(From a review: 415 s.) A server that accepts connections and never answers: the S3 run
    store's defaults (``S3_CONFIG``, kept under an option that sets one key of
    ``config_kwargs``, and ``S3_CALL_RETRIES``) give up, with one line, in seconds at a 1 s
    read timeout."""
    import socket
    import threading
    import time

    pytest.importorskip("s3fs")
    from recs.errors import RunStoreError
    from recs.nightly.artifacts import S3_CONFIG, RunStore

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_stay_silent() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_stay_silent, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        store = RunStore(
            f"s3://{BUCKET}/runs", {"endpoint_url": endpoint, "config_kwargs": {"read_timeout": 1}}
        )
        config = store.fs.config_kwargs
        assert (config["connect_timeout"], config["read_timeout"], store.fs.retries) == (10, 1, 3)
        assert S3_CONFIG["retries"] == {"max_attempts": 2}  # botocore rewrites its copy
        started = time.monotonic()
        with pytest.raises(RunStoreError, match="cannot reach it: ReadTimeoutError") as error:
            store.check()
        assert time.monotonic() - started < 30 and "\n" not in str(error.value)
        assert held  # it did connect: the time went to waiting for an answer
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
