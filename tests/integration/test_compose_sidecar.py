"""docker/docker-compose.sidecar.yml, checked without a Docker engine (the apache/kafka image cannot be pulled
everywhere the suite runs): a KRaft cluster whose brokers agree with each other, and two sidecars whose every
key is a real Shoal key, each with its own node id and addresses, naming those brokers as their upstream."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.common.config import BrokerConfig
from shoal.broker.upstream.settings import parse_upstream

from .test_deployment import DOCKER, REPO, as_list, load_compose, overrides, resolve, service_build

SIDECAR_COMPOSE = DOCKER / "docker-compose.sidecar.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = load_compose(SIDECAR_COMPOSE)
    assert "name" not in doc  # compose v1.29 rejects it: the project name is `-p shoal-sidecar`
    return dict(doc["services"])


def kafka_services(services: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each Apache Kafka service's environment, as text."""
    return {name: {k: str(v) for k, v in s["environment"].items()} for name, s in services.items()
            if str(s.get("image", "")).startswith("apache/kafka:")}


def sidecars(services: dict[str, Any]) -> dict[str, tuple[BrokerConfig, dict[str, str], dict[str, Any]]]:
    """Each Shoal service's config as the broker would load it (strict: an unknown key fails), its overrides
    and the service."""
    out = {}
    for name, service in services.items():
        built = service_build(SIDECAR_COMPOSE, service)
        if built is None or built[2].name != "broker":
            continue
        stage = built[2]
        argv = [resolve(a) for a in stage.entrypoint + as_list(service.get("command"))]
        # The image's properties file is this checkout's config/ (the Dockerfile copies the tree to /opt/shoal).
        config_file = REPO / argv[1].removeprefix(stage.workdir.rstrip("/") + "/")
        keys = overrides(argv)
        config = BrokerConfig.load(config_file, [f"{k}={v}" for k, v in keys.items()], strict=True)
        out[name] = (config, keys, service)
    return out


def addresses(text: str) -> dict[str, str]:
    """NAME -> host:port of a listener list."""
    return dict(item.split("://") for item in text.split(","))


def test_three_kafka_39_brokers_in_one_kraft_quorum(services: dict[str, Any]) -> None:
    kafkas = kafka_services(services)
    assert len(kafkas) == 3
    assert all(re.fullmatch(r"apache/kafka:3\.9\.\d+", services[n]["image"]) for n in kafkas)
    assert len({env["CLUSTER_ID"] for env in kafkas.values()}) == 1
    assert len({env["KAFKA_NODE_ID"] for env in kafkas.values()}) == 3
    voters = {}
    for voter in next(iter(kafkas.values()))["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","):
        node, _, address = voter.partition("@")
        voters[node] = address
    for name, env in kafkas.items():
        roles = set(env["KAFKA_PROCESS_ROLES"].split(","))
        assert "broker" in roles
        listeners = addresses(env["KAFKA_LISTENERS"])
        advertised = addresses(env["KAFKA_ADVERTISED_LISTENERS"])
        controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
        protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert set(listeners) <= set(protocols) and env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
        # Reached by its service name, on the port it listens on.
        for listener, address in advertised.items():
            host, port = address.split(":")
            assert host == name and listeners[listener].endswith(f":{port}")
        if "controller" in roles:
            assert voters[env["KAFKA_NODE_ID"]] == f"{name}:{listeners[controller].split(':')[1]}"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == next(iter(kafkas.values()))["KAFKA_CONTROLLER_QUORUM_VOTERS"]
        # Replication the cluster can give: no factor above its broker count, min ISR below the factor.
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) <= len(kafkas)
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"])
        assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) <= len(kafkas)
        assert any(name in arg for arg in services[name]["healthcheck"]["test"])
        assert "ports" not in services[name]  # clients use the sidecars
    assert len(voters) >= 1 and all(addr.split(":")[0] in kafkas for addr in voters.values())


def test_two_sidecars_each_with_its_own_identity_in_front_of_the_kafka_brokers(services: dict[str, Any]) -> None:
    kafkas = kafka_services(services)
    upstream_addresses = {addresses(env["KAFKA_ADVERTISED_LISTENERS"])[env["KAFKA_INTER_BROKER_LISTENER_NAME"]]
                          for env in kafkas.values()}
    found = sidecars(services)
    assert len(found) == 2
    node_ids, advertised_all = set(), []
    for name, (config, keys, service) in found.items():
        # Every upstream key is a client setting Shoal knows.
        settings = parse_upstream(config.upstream)
        assert {f"{h}:{p}" for h, p in settings.bootstrap} == upstream_addresses
        node_ids.add(config["node.id"])
        advertised = addresses(keys["advertised.listeners"])
        advertised_all += advertised.values()
        assert set(addresses(keys["listeners"])) == set(advertised) == {"PLAINTEXT", "INTERNAL"}
        assert advertised["INTERNAL"].split(":")[0] == name
        # The host's listener is advertised at the port published for it.
        listen_port = addresses(keys["listeners"])["PLAINTEXT"].split(":")[1]
        [published] = [resolve(str(p)) for p in service["ports"] if str(p).endswith(f":{listen_port}")]
        assert published.split(":")[1] == advertised["PLAINTEXT"].split(":")[1]
        assert published.startswith("127.0.0.1:")
        assert advertised["INTERNAL"] in service["healthcheck"]["test"]
        # Started once every upstream broker answers.
        assert {dep: cond["condition"] for dep, cond in service["depends_on"].items()} == {
            k: "service_healthy" for k in kafkas}
        assert {str(v).split(":")[0] for v in service["volumes"]} == {f"{name}-data"}
    assert len(node_ids) == 2 and not node_ids & {int(env["KAFKA_NODE_ID"]) for env in kafkas.values()}
    assert len(set(advertised_all)) == len(advertised_all)


def test_spark_job_and_tests_reach_a_sidecar_on_its_internal_listener(services: dict[str, Any]) -> None:
    found = sidecars(services)
    internal = {name: addresses(keys["advertised.listeners"])["INTERNAL"] for name, (_c, keys, _s) in found.items()}
    job = services["spark-orders-job"]
    # Both sidecars are active (they split the work through the sidecar group), and clients know both.
    assert set(job["environment"]["SHOAL_BOOTSTRAP"].split(",")) == set(internal.values())
    assert all(job["depends_on"][n]["condition"] == "service_healthy" for n in job["depends_on"])
    tests = services["tests"]
    assert tests["profiles"] == ["test"]  # a plain `up` starts the stack without running the tests
    built = service_build(SIDECAR_COMPOSE, tests)
    assert built is not None and built[2].name == "tests"
    assert set(tests["environment"]["SHOAL_BOOTSTRAP"].split(",")) == set(internal.values())
    upstream = {c.upstream["bootstrap.servers"] for c, _k, _s in found.values()}
    assert {tests["environment"]["SHOAL_UPSTREAM_BOOTSTRAP"]} == upstream
    assert len(found) == 2 and not any("profiles" in services[n] for n in found)
    for dependant in (job, tests):
        assert {n: d["condition"] for n, d in dependant["depends_on"].items()} == {n: "service_healthy" for n in found}
    # It runs the sidecar tests, which take the external upstream from SHOAL_UPSTREAM_BOOTSTRAP.
    for arg in as_list(tests["command"]):
        assert (REPO / arg).exists()
        assert "SHOAL_UPSTREAM_BOOTSTRAP" in (REPO / arg).read_text()


def test_documented_commands_name_the_sidecar_project() -> None:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), SIDECAR_COMPOSE, DOCKER / "compose-test.sh"]
    found = 0
    for path in files:
        for line in Path(path).read_text().splitlines():
            if "docker-compose.sidecar.yml" in line and re.search(r"docker compose |docker-compose |COMPOSE", line):
                found += 1
                assert re.search(r"-p\s+\"?shoal-sidecar\"?", line) or "SIDECAR_PROJECT" in line, \
                    f"{path.name}: {line.strip()!r}"
    assert found >= 2
