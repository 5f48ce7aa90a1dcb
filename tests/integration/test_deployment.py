"""The Docker deployment, checked without a Docker engine.

- the compose files parse, and everything they name exists: build contexts, Dockerfiles, stages, services,
  volumes, and every command is a console script the package (or, for the test image, its test extra) installs;
- the wheel `pip install .` builds holds every module the broker imports at start-up;
- the broker started the way the compose `shoal` service starts it (the image's ENTRYPOINT, the same
  properties file and overrides, as a separate process) answers the compose healthcheck, passes the
  `external` tests run against it with SHOAL_BOOTSTRAP, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
TEST_COMPOSE = DOCKER / "docker-compose.test.yml"
MAIN_COMPOSE = DOCKER / "docker-compose.yml"
SPARK_DOCKERFILE = REPO / "examples" / "Dockerfile.spark"
COMPOSE_FILES = sorted(DOCKER.glob("docker-compose*.yml"))
BIN = Path(sys.executable).parent

# The `external` tests the compose-style broker gets here: a few from every module that has some, so the
# check stays quick (the whole external subset is the same tests the suite already runs against its own
# brokers). The docker-compose `tests` service runs all of them.
QUICK_EXTERNAL_SUBSET = [
    "tests/integration/test_client_admin.py",
    "tests/integration/test_client_producer.py::test_keyed_records_land_where_librdkafka_murmur2_puts_them",
    "tests/integration/test_clients_roundtrip.py::test_create_topics_errors",
    "tests/integration/test_clients_roundtrip.py::test_fetch_long_poll_delivers_record_produced_later",
    "tests/integration/test_share_admin.py::test_describe_offsets_after_consuming_half",
    "tests/integration/test_share_groups.py::test_release_redelivers_with_higher_count_and_reject_never_again",
    "tests/integration/test_share_protocol.py::test_final_epoch_processes_acks_closes_session_and_releases",
]


# ---- reading the files ------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    user: str = "root"


def dockerfile_stages(path: Path) -> dict[str, Stage]:
    """The stages of a Dockerfile by name (the last one also as ""), with what they inherit."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            parts = rest.split()
            base = parts[0]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            parent = stages.get(base)
            current = Stage(name, base) if parent is None else Stage(
                name, base, parent.workdir, list(parent.entrypoint), list(parent.cmd), list(parent.healthcheck),
                list(parent.volumes), parent.user)
            stages[name] = current
            continue
        assert current is not None, f"{path}: {word} before FROM"
        if word == "WORKDIR":
            current.workdir = rest
        elif word == "USER":
            current.user = rest
        elif word == "ENTRYPOINT":
            current.entrypoint, current.cmd = exec_form(path, rest), []
        elif word == "CMD":
            current.cmd = exec_form(path, rest)
        elif word == "VOLUME":
            current.volumes += exec_form(path, rest)
        elif word == "HEALTHCHECK":
            current.healthcheck = [] if rest.upper() == "NONE" else exec_form(path, rest[rest.index("CMD ") + 4:])
    if current is not None:
        stages[""] = current
    return stages


def exec_form(path: Path, text: str) -> list[str]:
    """The JSON (exec) form; the shell form would put /bin/sh between docker stop and the broker."""
    assert text.lstrip().startswith("["), f"{path}: {text!r} is not in exec form"
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def load_compose(path: Path) -> dict[str, Any]:
    """The file as compose reads it; an override (docker-compose.NAME.VARIANT.yml, used with `-f` after
    docker-compose.NAME.yml) merged onto its base, so it is checked as the stack it runs."""
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), f"{path} has no services"
    m = re.fullmatch(r"(docker-compose\.[\w-]+)\.[\w-]+\.yml", path.name)
    if m is not None and (path.parent / f"{m[1]}.yml").is_file():
        merged = merge_compose(load_compose(path.parent / f"{m[1]}.yml"), doc)
        assert set(merged["services"]) == set(load_compose(path.parent / f"{m[1]}.yml")["services"]), \
            f"{path.name} adds services its base does not have"
        return merged
    return doc


def merge_compose(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of an override file: mappings key by key; `volumes` and `ports` lists joined (an
    override's mount of a path replaces the base's); any other value replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge_compose(base[k], v, k) if k in base else v
        return out
    if key in ("volumes", "ports") and isinstance(base, list) and isinstance(override, list):
        def target(entry: Any) -> str:
            parts = str(entry).split(":")  # SOURCE:TARGET[:MODE], or a bare TARGET
            return parts[min(1, len(parts) - 1)] if key == "volumes" else str(entry)
        replaced = {target(e) for e in override}
        return [e for e in base if target(e) not in replaced] + list(override)
    return override


def service_build(compose: Path, service: dict[str, Any]) -> tuple[Path, Path, Stage] | None:
    """(context, Dockerfile, stage) of a service that builds its image."""
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        build = {"context": build}
    context = (compose.parent / build.get("context", ".")).resolve()
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    assert context.is_dir() and dockerfile.is_file(), f"{compose.name}: no build context {context} or {dockerfile}"
    stages = dockerfile_stages(dockerfile)
    target = build.get("target", "")
    assert target in stages, f"{compose.name}: no stage {target!r} in {dockerfile}"
    return context, dockerfile, stages[target]


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def project_scripts() -> set[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"]["scripts"])


def extra_console_scripts() -> set[str]:
    """Console scripts of the distributions the [test] extra pins."""
    with open(REPO / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[\[=<>~! ]", pin, maxsplit=1)[0] for pin in pins}
    return {ep.name for n in names for ep in metadata.distribution(n).entry_points if ep.group == "console_scripts"}


def check_command(where: str, argv: list[str], context: Path, scripts: set[str]) -> None:
    assert argv, f"{where}: empty command"
    exe = argv[0]
    if exe in ("python", "python3"):
        assert len(argv) > 1 and (context / argv[1]).is_file(), f"{where}: {argv} runs no file of the build context"
    else:
        assert exe in scripts, f"{where}: {exe!r} is not a console script the image installs ({sorted(scripts)})"


# ---- the files --------------------------------------------------------------------------------------


def test_compose_files_parse_and_everything_they_name_exists() -> None:
    assert TEST_COMPOSE in COMPOSE_FILES
    for compose in COMPOSE_FILES:
        doc = load_compose(compose)
        services = doc["services"]
        declared_volumes = set(doc.get("volumes") or {})
        for name, service in services.items():
            built = service_build(compose, service)
            assert built is not None or service.get("image"), f"{compose.name}: {name} has neither build nor image"
            if built is not None:
                context, _, _ = built
                assert (context / ".dockerignore").is_file(), f"{compose.name}: {name}'s context has no .dockerignore"
            depends = service.get("depends_on") or []
            for dep in depends:
                assert dep in services, f"{compose.name}: {name} depends on unknown service {dep}"
            for mount in service.get("volumes") or []:
                source = str(mount).split(":")[0]
                if source.startswith((".", "/")):
                    assert (compose.parent / source).exists(), f"{compose.name}: {name} mounts missing {source}"
                else:
                    assert source in declared_volumes, f"{compose.name}: {name} mounts undeclared volume {source}"


def test_every_command_is_a_console_script_the_image_installs() -> None:
    shoal_scripts = project_scripts()
    assert {"shoal-broker", "kafka-broker-api-versions"} <= shoal_scripts
    checked = 0
    for compose in COMPOSE_FILES:
        for name, service in load_compose(compose)["services"].items():
            built = service_build(compose, service)
            if built is None:
                continue  # a published image (Prometheus, Grafana)
            context, dockerfile, stage = built
            # The test image also has the [test] extra's commands (pytest).
            scripts = shoal_scripts | (extra_console_scripts() if stage.name == "tests" else set())
            where = f"{compose.name}:{name}"
            entrypoint = as_list(service["entrypoint"]) if "entrypoint" in service else stage.entrypoint
            command = as_list(service["command"]) if "command" in service else stage.cmd
            check_command(where, entrypoint or command, context, scripts)
            health = service.get("healthcheck", {}).get("test") or (["CMD", *stage.healthcheck] if stage.healthcheck else [])
            if health and health != ["NONE"]:
                assert health[0] == "CMD", f"{where}: healthcheck {health} is not in exec form"
                check_command(f"{where} healthcheck", health[1:], context, scripts)
            if stage.name == "tests":
                # Arguments to pytest: the test folders or files exist in the image's source tree.
                assert all((context / arg).exists() for arg in command if not arg.startswith("-"))
            checked += 1
    assert checked >= 3


WHEEL_STAGE = "broker-wheel"


def test_broker_image_runs_as_non_root_with_its_data_in_a_volume() -> None:
    stage = dockerfile_stages(DOCKER / "Dockerfile")["broker"]
    assert stage.user not in ("root", "0", "")
    argv = stage.entrypoint + stage.cmd
    assert argv[0] == "shoal-broker"
    [log_dirs] = [a.split("=", 1)[1] for a in argv if a.startswith("log.dirs=")]
    assert log_dirs in stage.volumes
    for dockerfile in (DOCKER / "Dockerfile", SPARK_DOCKERFILE):
        text = dockerfile.read_text()
        # The package is installed from pyproject.toml, never from a hand-kept list of folders: the sources are
        # the whole context (.dockerignore leaves state out); before them only pyproject.toml and the script
        # that lists its requirements are copied.
        assert "pip install --no-cache-dir --no-deps --no-build-isolation ." in text
        copies = re.findall(r"^COPY (.*)$", text, re.M)
        assert copies and all(
            c == ". ." or c.startswith("--from=requirements ") or c == "pyproject.toml docker/requirements.py ./"
            or c == f"--from={WHEEL_STAGE} /wheels /tmp/wheels"
            for c in copies
        ), copies
    # The broker image installs the wheel a stage with a compiler built from the whole context, and that
    # stage fails the build if either C extension is missing from it.
    wheel_stage = dockerfile_steps(DOCKER / "Dockerfile")[WHEEL_STAGE]
    [build] = [rest for word, rest in wheel_stage if word == "RUN" and "pip wheel" in rest]
    assert "--wheel-dir /wheels ." in build and "_record_walk" in build and "_fsync_worker" in build
    assert ("COPY", f"--from={WHEEL_STAGE} /wheels /tmp/wheels") in dockerfile_steps(DOCKER / "Dockerfile")["broker"]
    # Container logs are JSON lines by default, for log collectors.
    assert "log.format=json" in argv


# ---- the build cache ---------------------------------------------------------------------------------


def dockerfile_steps(path: Path) -> dict[str, list[tuple[str, str]]]:
    """(instruction, rest) of each stage by name, in order."""
    text = re.sub(r"\\\n", " ", path.read_text())
    steps: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            parts = rest.split()
            current = steps.setdefault(parts[2] if len(parts) >= 3 else f"#{len(steps)}", [])
            rest = parts[0]  # the base; the stage's name is the key
        current.append((word.upper(), " ".join(rest.split())))
    return steps


@pytest.mark.parametrize("dockerfile", ["docker/Dockerfile", "examples/Dockerfile.spark"])
def test_dependencies_are_installed_before_the_sources_are_copied(dockerfile: str) -> None:
    """A source edit invalidates only `COPY . .` and what follows it: the package itself, a user, metadata.
    No apt-get, no dependency download after the sources (the `tests` stage once re-ran apt, OpenJDK and
    PySpark on every edit), and the dependency installs come from lists that change only with pyproject.toml."""
    steps = dockerfile_steps(REPO / dockerfile)
    sources_copied = 0
    for name, stage in steps.items():
        copy_at = stage.index(("COPY", ". .")) if ("COPY", ". .") in stage else len(stage)
        sources_copied += copy_at < len(stage)
        for run in [rest for word, rest in stage[copy_at + 1:] if word == "RUN"]:
            assert "apt-get" not in run and " -r " not in run, f"{dockerfile} {name}: {run}"
            installs = re.findall(r"pip install ([^&]*)", run)
            assert all("--no-deps" in i and i.split()[-1] in (".", "/tmp/wheels/*.whl") for i in installs), \
                f"{dockerfile} {name}: {run}"
        for word, rest in stage:
            if word == "RUN" and "pip install" in rest and "--no-deps" not in rest:
                # a dependency install: from pinned versions, never a bare package name
                reqs = [a for a in rest.split("pip install", 1)[1].split("&&")[0].split() if not a.startswith("-")]
                assert all("==" in r.strip('"') or r.startswith("/tmp/requirements/") for r in reqs), (name, reqs)
    assert sources_copied >= 1


def test_test_image_inherits_no_volume_and_shares_the_spark_layers() -> None:
    stages = dockerfile_stages(DOCKER / "Dockerfile")
    # An inherited VOLUME left an anonymous volume behind each `up --exit-code-from tests`.
    assert stages["tests"].volumes == []
    assert stages["broker"].volumes == ["/var/lib/shoal"]
    # examples/Dockerfile.spark starts with the same steps as the test image's Java/PySpark stage, so the
    # two images share those layers (the same instruction on the same parent is a cache hit).
    spark = dockerfile_steps(SPARK_DOCKERFILE)
    [final] = [s for name, s in spark.items() if name.startswith("#")]
    runtime = dockerfile_steps(DOCKER / "Dockerfile")["spark-runtime"]
    assert final[: len(runtime)] == runtime


def requirements_module() -> Any:
    spec = importlib.util.spec_from_file_location("docker_requirements", DOCKER / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_spark_image_pins_the_versions_the_test_extra_pins() -> None:
    """The Spark job's image runs what the Spark source is tested with (the [test] extra, which takes in
    [spark]); pyarrow and numpy were once left to float."""
    test_pins = dict(
        re.sub(r"\[.*\]", "", pin).split("==", 1) for pin in requirements_module().extra(pyproject(), "test") if "==" in pin
    )
    for path in (SPARK_DOCKERFILE, DOCKER / "Dockerfile"):
        pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?==([^"]+)"', path.read_text()))
        assert {"pyspark", "pandas", "pyarrow", "numpy"} <= set(pins), (path, pins)
        assert pins == {k: test_pins[k] for k in pins}, (path, pins)


def test_requirements_lists_follow_pyproject(tmp_path: Path) -> None:
    doc = pyproject()
    requirements_module().main(tmp_path, REPO / "pyproject.toml")
    broker = (tmp_path / "broker.txt").read_text().split()
    test = (tmp_path / "test.txt").read_text().splitlines()
    assert broker == [*doc["build-system"]["requires"], *doc["project"]["dependencies"]]
    # pip would look for Shoal itself on the index: its own extras are expanded instead.
    extras = doc["project"]["optional-dependencies"]
    own = [r for r in extras["test"] if re.match(r"shoal\b", r)]
    assert not [r for r in test if re.match(r"shoal\b", r)]
    assert set(test) == {r for r in extras["test"] if r not in own} | {
        r for o in own for name in o[o.index("[") + 1:-1].split(",") for r in extras[name.strip()]}
    assert len(test) == len(set(test))


# ---- the stacks -------------------------------------------------------------------------------------


def overrides(argv: list[str]) -> dict[str, str]:
    """key -> value of the `--override key=value` pairs in a command line (the last one wins, as in the broker)."""
    return {argv[i + 1].split("=", 1)[0]: argv[i + 1].split("=", 1)[1]
            for i, arg in enumerate(argv[:-1]) if arg == "--override"}


def resolve(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ${VAR:-default} substitution, with the defaults unless `env` sets the variable."""
    env = env or {}
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), value)


def test_published_ports_are_on_loopback_unless_asked_otherwise() -> None:
    published = 0
    for compose in COMPOSE_FILES:
        for name, service in load_compose(compose)["services"].items():
            for port in service.get("ports") or []:
                published += 1
                host, _, _ = resolve(str(port)).rpartition(":")
                # The broker's PLAINTEXT listener has no authentication and Grafana lets anonymous viewers in.
                assert host.split(":")[0] == "127.0.0.1", f"{compose.name}:{name} publishes {port} on every interface"
                assert resolve(str(port), {"SHOAL_PUBLISH_HOST": "0.0.0.0"}).startswith("0.0.0.0:")
    assert published >= 4


def test_main_stack_containers_reach_the_broker_by_service_name_on_an_internal_listener() -> None:
    """Not `network_mode: service:shoal`: a job in the broker's network namespace was stranded when the broker
    restarted (connection refused for ever) or was re-created (its namespace gone)."""
    services = load_compose(MAIN_COMPOSE)["services"]
    assert all("network_mode" not in s for s in services.values())
    built = service_build(MAIN_COMPOSE, services["shoal"])
    assert built is not None
    argv = built[2].entrypoint + as_list(services["shoal"]["command"])
    keys = overrides(argv)
    listeners = dict(item.split("://") for item in keys["listeners"].split(","))
    advertised = dict(item.split("://") for item in resolve(keys["advertised.listeners"]).split(","))
    assert set(listeners) == set(advertised) == {"PLAINTEXT", "INTERNAL"}
    protocols = dict(item.split(":") for item in keys["listener.security.protocol.map"].split(","))
    assert protocols == {"PLAINTEXT": "PLAINTEXT", "INTERNAL": "PLAINTEXT"}
    # The host's listener is advertised at the published port; the network's at the service name.
    assert advertised["PLAINTEXT"] == "localhost:9092"
    assert resolve(keys["advertised.listeners"], {"SHOAL_PORT": "19999"}).startswith("PLAINTEXT://localhost:19999,")
    [published] = [p for p in services["shoal"]["ports"] if resolve(str(p)).endswith(":" + listeners["PLAINTEXT"].split(":")[1])]
    assert resolve(str(published)).split(":")[1] == advertised["PLAINTEXT"].split(":")[1]
    internal_host, internal_port = advertised["INTERNAL"].split(":")
    assert internal_host == "shoal" and listeners["INTERNAL"] == f"0.0.0.0:{internal_port}"
    assert services["spark-orders-job"]["environment"]["SHOAL_BOOTSTRAP"] == advertised["INTERNAL"]
    assert advertised["INTERNAL"] in services["shoal"]["healthcheck"]["test"]


def test_every_documented_compose_command_names_its_project() -> None:
    """Both compose files sit in docker/, so without `-p` both stacks get the project name `docker`: bringing
    up the test stack's `shoal` replaced the main broker and ran the test configuration on its data volume.
    (Compose v1.29 rejects a top-level `name:` key, so the project name is given on the command line.)"""
    projects: dict[str, set[str]] = {}
    files = [REPO / "README.md", REPO / "Makefile", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *COMPOSE_FILES]
    for path in files:
        for line in path.read_text().splitlines():
            if not re.search(r"docker compose |docker-compose |\$\(COMPOSE\) ", line) or " -f " not in line:
                continue
            m = re.search(r"-p\s+\"?([\w$\-]+)\"?.*-f\s+docker/(docker-compose[\w.]*\.yml)", line)
            assert m, f"{path.name}: {line.strip()!r} has no -p before -f"
            projects.setdefault(m.group(2), set()).add(m.group(1))
    assert projects.get("docker-compose.yml") == {"shoal"}, projects
    assert projects.get("docker-compose.test.yml") == {"shoal-test"}, projects
    assert "name" not in load_compose(MAIN_COMPOSE) and "name" not in load_compose(TEST_COMPOSE)


# ---- the broker as the compose service starts it ----------------------------------------------------


def compose_broker_command(data_dir: Path) -> list[str]:
    """The `shoal` service's command line (the image's ENTRYPOINT, then the compose `command`), made to run
    here: the image's paths point into this checkout, the listener is a free loopback port (advertised as
    itself: `shoal` only resolves inside the compose network), the data directory is `data_dir`, and the
    Prometheus endpoint takes a free port. Every other key is exactly as the container gets it."""
    service = load_compose(TEST_COMPOSE)["services"]["shoal"]
    built = service_build(TEST_COMPOSE, service)
    assert built is not None
    _, _, stage = built
    argv = stage.entrypoint + (as_list(service["command"]) if "command" in service else stage.cmd)
    workdir = stage.workdir.rstrip("/") + "/"
    out = [str(BIN / argv[0])]
    args = iter(argv[1:])
    for arg in args:
        if arg == "--override":
            key, _, value = next(args).partition("=")
            if key == "advertised.listeners":
                continue
            value = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(data_dir)}.get(key, value)
            out += ["--override", f"{key}={value}"]
        else:
            assert arg.startswith(workdir), f"{arg} is not in the image's source tree"
            path = REPO / arg[len(workdir):]
            assert path.is_file()
            out.append(str(path))
    return out + ["--override", "metrics.port=0"]


def test_compose_broker_is_configured_like_the_suites_own_brokers() -> None:
    """The external tests pass against the suite's module brokers; the compose broker gets their overrides."""
    command = compose_broker_command(Path("/unused"))
    assert all(f"{item}" in command for item in FAST_HEARTBEAT), (FAST_HEARTBEAT, command)


def compose_broker(base: Path, *python_flags: str) -> BrokerProcess:
    command = compose_broker_command(base / "data")
    # Run the installed console script with this interpreter (and its flags).
    return BrokerProcess(base / "data", command=[sys.executable, *python_flags, *command])


def healthcheck(bootstrap: str) -> subprocess.CompletedProcess[str]:
    test = load_compose(TEST_COMPOSE)["services"]["shoal"]["healthcheck"]["test"]
    argv = [bootstrap if arg == "shoal:9092" else arg for arg in test[1:]]
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def started_like_compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # -X importtime logs every module the broker imports, for the wheel check.
    proc = compose_broker(tmp_path_factory.mktemp("compose-broker"), "-X", "importtime").start()
    yield proc
    proc.stop()


def test_compose_healthcheck_is_an_api_versions_round_trip(started_like_compose: BrokerProcess) -> None:
    probe = healthcheck(started_like_compose.bootstrap)
    assert probe.returncode == 0, probe.stderr
    head, *apis, tail = probe.stdout.splitlines()
    # Kafka's kafka-broker-api-versions format; the broker is reached at its advertised address.
    assert head == f"{started_like_compose.bootstrap} (id: 1 rack: null) -> (" and tail == ")"
    assert all(re.fullmatch(r"\t\w+\(\d+\): \d+( to \d+)? \[usable: \d+\],?", line) for line in apis), apis
    names = {line.strip().split("(")[0] for line in apis}
    assert {"ApiVersions", "Metadata", "ShareFetch", "ShareAcknowledge"} <= names


def test_external_tests_pass_against_the_compose_style_broker(started_like_compose: BrokerProcess) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "external", *QUICK_EXTERNAL_SUBSET],
        cwd=REPO, env={**os.environ, "SHOAL_BOOTSTRAP": started_like_compose.bootstrap},
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, summary


def test_wheel_holds_every_module_the_broker_imports_at_start_up(
    started_like_compose: BrokerProcess, tmp_path: Path
) -> None:
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(shoal(?:\.\w+)*)$", started_like_compose.log_text(), re.M))
    assert {"shoal.broker.server.main", "shoal.protocol.codec"} <= imported
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("shoal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # A module is its .py, its package's __init__.py, or a compiled extension (the optional record walk).
    forms = [".py", "/__init__.py", *importlib.machinery.EXTENSION_SUFFIXES]
    missing = sorted(m for m in imported if not any(f"{m.replace('.', '/')}{form}" in names for form in forms))
    assert not missing, f"the wheel lacks {missing}"
    # The protocol specs are data the codec loads at start-up.
    specs = {p.name for p in (REPO / "protocol" / "specs").glob("*.json")}
    assert specs and {f"shoal/protocol/specs/{s}" for s in specs} <= names
    # So are Shoal's extensions of them: without these the codec would not match the generated classes.
    extensions = {p.name for p in (REPO / "protocol" / "extensions").glob("*.json")}
    assert extensions and {f"shoal/protocol/extensions/{s}" for s in extensions} <= names


def test_sigterm_stops_the_broker_cleanly(tmp_path: Path) -> None:
    from shoal.client import Producer

    broker = compose_broker(tmp_path).start()
    try:
        with Producer(broker.bootstrap) as producer:
            assert producer.send("sigterm-check", b"v").result(30).offset == 0
    finally:
        # SIGTERM; a broker still running 15 s later is SIGKILLed and the exit code says so.
        code = broker.stop()
    assert code == 0, broker.log_text()[-3000:]
    assert "broker stopping" in broker.log_text() and "Traceback" not in broker.log_text()
    assert healthcheck(broker.bootstrap).returncode != 0
