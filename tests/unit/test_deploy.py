"""docker-compose.yml and the Dockerfile, checked against the code they deploy.

No container engine runs here, so these read the files: every ``RECS_*`` variable is one ``recs``
reads (a typo would be silently ignored: ``extra="ignore"``); the snapshot reads the standby and
everything else the primary; every container of our code runs the image the Dockerfile builds,
which installs the pinned requirements and the package at build time (nothing at start) and puts
the DAGs, plugins and dbt project where the settings point; every Airflow container gets the
same secrets, from the environment ``make compose-env`` writes; the workers reach the execution
API, the broker and the metadata DB by service names; every container of our code mounts the
``RECS_HOME`` volume at ``RECS_HOME``; data is loaded by the one-off ``recs-cli`` service the
README names. ``docker-compose config`` validates the file where it is installed.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from recs.cli import app
from recs.config import Settings
from recs.nightly.models import PROJECT_DIR_ENV

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
IMAGE = "recs-platform:local"
SECRETS = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY")
SHARED = (  # what every Airflow container must agree on besides the secrets
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "RECS_HOME",
    "RECS_STORE_URL",
    "RECS_SNAPSHOT_STORE_URL",
    "RECS_RUN_STORE_URL",
    "RECS_RUN_STORE_OPTIONS",
)


def _document() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _services() -> dict[str, dict]:
    return _document()["services"]


def _environments() -> dict[str, dict[str, str]]:
    return {name: dict(service.get("environment") or {}) for name, service in _services().items()}


def _command(service: dict) -> str:
    command = service.get("command") or []
    return command if isinstance(command, str) else shlex.join(command)


def _ours() -> dict[str, dict]:
    """The services that run our code (airflow or recs commands)."""
    return {
        name: service
        for name, service in _services().items()
        if re.search(r"\b(airflow|recs)\b", _command(service).split("&&")[0])
    }


def _airflow_services() -> dict[str, dict]:
    return {name: s for name, s in _ours().items() if "airflow" in _command(s).split("&&")[0]}


def _dockerfile() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            instructions.append((keyword.upper(), " ".join(arguments.split())))
    return instructions


def _dockerfile_env() -> dict[str, str]:
    env = {}
    for keyword, arguments in _dockerfile():
        if keyword == "ENV":
            env.update(word.split("=", 1) for word in shlex.split(arguments))
    return env


def _copied_to() -> dict[str, str]:
    """``{source folder or file: absolute destination}`` of the Dockerfile's COPY lines."""
    workdir, copies = "/", {}
    for keyword, arguments in _dockerfile():
        if keyword == "WORKDIR":
            workdir = arguments
        elif keyword == "COPY":
            *sources, destination = shlex.split(arguments)
            for source in sources:
                target = destination if destination.startswith("/") else f"{workdir}/{destination}"
                if target.endswith("/") and not source.endswith("/"):
                    target += source  # COPY a b ./ puts each file into the folder
                copies[source.rstrip("/")] = str(Path(target.replace("/./", "/")))
    return copies


def _compose_env_module():
    spec = importlib.util.spec_from_file_location("compose_env", REPO / "deploy" / "compose_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_recs_variable_set_is_one_recs_reads():
    """A setting of ``recs.config.Settings``, or a name the package reads itself
    (``RECS_DBT_PROJECT_DIR``, ``recs.nightly.models``)."""
    fields = {f"RECS_{name.upper()}" for name in Settings.model_fields}
    sources = "\n".join(p.read_text() for p in (REPO / "include" / "recs").rglob("*.py"))
    read_by_recs = fields | set(re.findall(r"[\"'](RECS_[A-Z0-9_]+)[\"']", sources))
    used = {key for env in _environments().values() for key in env if key.startswith("RECS_")}
    used |= {key for key in _dockerfile_env() if key.startswith("RECS_")}
    assert used, "neither file sets a RECS_* variable"
    assert sorted(used - read_by_recs) == []


def test_the_batch_snapshots_the_standby_and_everything_else_uses_the_primary():
    environments = _environments()
    worker, api, cli = (environments[n] for n in ("airflow-worker", "recs-api", "recs-cli"))
    assert "@recs-store/" in worker["RECS_STORE_URL"]
    assert "@recs-store-standby/" in worker["RECS_SNAPSHOT_STORE_URL"]
    assert api["RECS_STORE_URL"] == worker["RECS_STORE_URL"] == cli["RECS_STORE_URL"]
    assert "RECS_SNAPSHOT_STORE_URL" not in api
    assert "RECS_SNAPSHOT_STORE_URL" not in cli


def test_the_cli_and_the_workers_share_the_run_store_and_empty_means_none():
    """(From a review.) ``recs rollback`` and ``publish`` from ``recs-cli`` record ``CURRENT``
    in the run store as the workers' publish does (and ``gc`` reads it), so both read the same
    setting, from the environment; left empty, as ``make compose-env`` leaves it, there is
    no run store (one machine, or one shared file system)."""
    environments = _environments()
    for key in ("RECS_RUN_STORE_URL", "RECS_RUN_STORE_OPTIONS"):
        worker, cli = environments["airflow-worker"][key], environments["recs-cli"][key]
        assert worker == cli == f"${{{key}:-}}", key
    empty = Settings(_env_file=None, run_store_url="", run_store_options="")
    assert (empty.run_store_url, empty.run_store_options) == (None, {})


def test_every_container_of_our_code_runs_the_image_and_installs_nothing_at_start():
    ours = _ours()
    assert {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-worker",
            "airflow-init", "recs-api", "recs-cli"} <= set(ours)  # fmt: skip
    for name, service in ours.items():
        assert service.get("image") == IMAGE, name
        build = service.get("build")
        context = build if isinstance(build, str) else (build or {}).get("context")
        assert context and (REPO / context).resolve() == DOCKERFILE.parent, name
        assert "pip install" not in _command(service), name
        assert "entrypoint" not in service, name
        sources = [_mount(volume)[0] for volume in service.get("volumes") or []]
        assert not [s for s in sources if s in (".", "./")], f"{name} mounts the source"
    text = COMPOSE.read_text()
    assert "_PIP_ADDITIONAL_REQUIREMENTS" not in text
    assert "pip install" not in text


def test_the_dockerfile_installs_the_pinned_requirements_and_the_package_at_build_time():
    instructions = _dockerfile()
    (base,) = [arguments for keyword, arguments in instructions if keyword == "FROM"]
    assert base.startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}-"), (
        "the image runs the Python the tests run on"
    )
    runs = [arguments for keyword, arguments in instructions if keyword == "RUN"]
    assert any("pip install -r requirements.txt" in run for run in runs)
    packages = [run for run in runs if re.search(r"pip install --no-deps \.(\s|$)", run)]
    assert len(packages) == 1, "install the package once, from its wheel: pip install --no-deps ."
    assert " -e " not in packages[0] and "--editable" not in packages[0]
    copies = _copied_to()
    for source in copies:
        assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is not here"
    order = [keyword for keyword, _ in instructions]
    first_install = order.index("RUN", order.index("COPY"))
    assert list(copies)[0] == "requirements.txt" and order.index("COPY") < first_install
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "data", ".env", ".git"} <= set(ignored)


def test_the_image_puts_dags_plugins_and_dbt_where_the_settings_point():
    env, copies = _dockerfile_env(), _copied_to()
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == copies["dags"]
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == copies["plugins"]
    assert env[PROJECT_DIR_ENV] == env["DBT_PROFILES_DIR"] == copies["dbt_project"]
    assert (REPO / "dbt_project" / "dbt_project.yml").is_file()
    assert not (REPO / "dbt_project" / "packages.yml").exists(), "packages need `dbt deps`"


def test_every_airflow_container_shares_one_set_of_secrets_from_the_environment():
    airflow = {name: _environments()[name] for name in _airflow_services()}
    assert {"airflow-apiserver", "airflow-scheduler", "airflow-worker"} <= set(airflow)
    for key in (*SECRETS, *SHARED):
        values = {name: env.get(key) for name, env in airflow.items()}
        assert len(set(values.values())) == 1 and None not in values.values(), (key, values)
    referenced = set()
    for key in SECRETS:
        value = next(iter(airflow.values()))[key]
        match = re.fullmatch(r"\$\{(\w+)(:\?[^}]*)?\}", value)
        assert match, f"{key} must come from the environment, not the file: {value!r}"
        referenced.add(match.group(1))
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    assert referenced <= required
    written = set(_compose_env_module().fresh_secrets())
    assert required == written, "make compose-env must write exactly what the file requires"


def test_the_workers_reach_the_execution_api_the_broker_and_the_metadata_db():
    services, env = _services(), _environments()["airflow-worker"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    execution = _url(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    api_command = services[execution.hostname]["command"]
    assert api_command[:2] == ["airflow", "api-server"]
    assert str(execution.port) == api_command[api_command.index("--port") + 1]
    assert execution.path == "/execution/"
    assert services["airflow-worker"]["depends_on"][execution.hostname] == {
        "condition": "service_healthy"
    }
    broker = _url(env["AIRFLOW__CELERY__BROKER_URL"])
    assert broker.hostname in services and "redis" in services[broker.hostname]["image"]
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND"):
        database = _url(env[key])
        assert database.scheme.removeprefix("db+") == "postgresql+psycopg", key  # psycopg 3
        assert database.hostname in services and "postgres" in services[database.hostname]["image"]


def _mount(volume: str) -> tuple[str, str, str]:
    """``(source, target, mode)`` of a short-syntax volume, ``${...}`` references blanked."""
    source, target, *mode = re.sub(r"\$\{[^}]*\}", "x", str(volume)).split(":")
    return source, target, (mode or ["rw"])[0]


def _url(value: str):
    """A URL of the compose file with its ``${...}`` references replaced by a placeholder."""
    return urlsplit(re.sub(r"\$\{[^}]*\}", "x", value))


def test_every_container_of_our_code_mounts_the_recs_home_volume_at_recs_home():
    home = _dockerfile_env()["RECS_HOME"]
    volumes = _document()["volumes"]
    for name, service in _ours().items():
        assert (service.get("environment") or {}).get("RECS_HOME") == home, name
        mounts = [_mount(volume) for volume in service.get("volumes") or []]
        recs_data = [mount for mount in mounts if mount[1] == home]
        assert len(recs_data) == 1, f"{name} does not mount RECS_HOME ({home}): {mounts}"
        ((volume, _, mode),) = recs_data
        assert volume == "recs-data" and volume in volumes, name
        if name != "recs-api":  # the read API only reads
            assert mode == "rw", f"{name} must write RECS_HOME"
    logs = f"{_dockerfile_env()['AIRFLOW_HOME']}/logs"
    for name, service in _airflow_services().items():
        assert f"airflow-logs:{logs}" in service["volumes"], name


def test_data_is_loaded_by_the_one_off_cli_service_the_readme_names():
    cli = _services()["recs-cli"]
    assert cli.get("profiles"), "recs-cli must not start with `docker compose up`"
    commands = set(typer.main.get_command(app).commands)
    readme = (REPO / "README.md").read_text()
    documented = re.findall(r"docker compose run --rm recs-cli recs ([a-z-]+)", readme)
    assert "load-dataset" in documented
    assert set(documented) <= commands
    datasets = cli["environment"]["RECS_DATASETS_DIR"]
    assert any(_mount(volume)[1] == datasets for volume in cli["volumes"])


@pytest.fixture
def docker_compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")


def test_docker_compose_accepts_the_file_and_refuses_it_without_the_secrets(
    docker_compose, tmp_path
):
    env_file = tmp_path / "compose.env"
    assert _compose_env_module().write(env_file)
    assert not _compose_env_module().write(env_file), "an existing file is never overwritten"
    base = [*docker_compose, "--project-directory", str(REPO), "-f", str(COMPOSE)]
    valid = subprocess.run(
        [*base, "--env-file", str(env_file), "config", "-q"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert valid.returncode == 0, valid.stderr
    (tmp_path / "empty.env").write_text("")
    refused = subprocess.run(
        [*base, "--env-file", str(tmp_path / "empty.env"), "config", "-q"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "make compose-env" in refused.stderr
