"""Sidecar mode's pure parts: the `upstream.*` settings and how a request is cut per upstream leader."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.common.config import BrokerConfig, ConfigError
from shoal.broker.upstream.cluster import Leadership, UpstreamCluster
from shoal.broker.upstream.forwarder import PRODUCE, Forwarder
from shoal.broker.upstream.settings import UpstreamConfigError, parse_upstream
from shoal.protocol import messages

# ---- settings -----------------------------------------------------------------------------------


def test_upstream_keys_turn_the_mode_on_and_are_not_unknown_keys() -> None:
    config = BrokerConfig.from_strings({"upstream.bootstrap.servers": "a:9092,b:9093",
                                        "upstream.security.protocol": "SASL_SSL"}, strict=True)
    assert config.upstream == {"bootstrap.servers": "a:9092,b:9093", "security.protocol": "SASL_SSL"}
    assert config.notes == []
    assert BrokerConfig.from_strings({}).upstream == {}


def test_upstream_keys_without_bootstrap_servers_are_refused() -> None:
    with pytest.raises(ConfigError, match="upstream.bootstrap.servers"):
        BrokerConfig.from_strings({"upstream.security.protocol": "SSL"})


def test_jaas_line_gives_the_sasl_credentials() -> None:
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="shoal" '
            'password="p=a;s\\"s";')
    settings_ = parse_upstream({"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas})
    assert settings_.bootstrap == [("h", 1)]
    client = settings_.client
    assert (client.sasl_mechanism, client.sasl_username, client.sasl_password) == ("SCRAM-SHA-512", "shoal", 'p=a;s"s')


def test_tls_files_map_to_the_client_settings() -> None:
    client = parse_upstream({"bootstrap.servers": "h:1", "security.protocol": "SSL",
                             "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
                             "ssl.keystore.location": "/me.pem", "ssl.endpoint.identification.algorithm": ""}).client
    assert client.ssl_ca_location == "/ca.pem"
    assert client.ssl_certificate_location == client.ssl_key_location == "/me.pem"
    assert client.ssl_check_hostname is False


def test_connection_setup_timeouts_configure_the_upstream_connections() -> None:
    client = parse_upstream({"bootstrap.servers": "h:1", "socket.connection.setup.timeout.ms": "2000",
                             "socket.connection.setup.timeout.max.ms": "8000"}).client
    assert (client.socket_connection_setup_timeout_ms, client.socket_connection_setup_timeout_max_ms) == (2000, 8000)


@pytest.mark.parametrize("keys, message", [
    ({"bootstrap.servers": "h:1", "linger.ms": "5"}, "upstream.linger.ms is not a client setting"),
    ({"bootstrap.servers": "nohost"}, "upstream.bootstrap.servers"),
    ({"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT"}, "sasl.username"),
    ({"bootstrap.servers": "h:1", "sasl.jaas.config": "x required;"}, "username"),
])
def test_bad_upstream_settings_are_named(keys: dict[str, str], message: str) -> None:
    with pytest.raises(UpstreamConfigError, match=message):
        parse_upstream(keys)


# ---- routing ------------------------------------------------------------------------------------

Produce = messages.ProduceRequest


@st.composite
def produce_requests(draw: st.DrawFn) -> tuple[Produce, dict[tuple[str, int], int]]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True))
    leaders: dict[tuple[str, int], int] = {}
    topics = []
    for name in names:
        parts = draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
        for p in parts:
            leaders[(name, p)] = draw(st.integers(1, 3))
        topics.append(Produce.TopicProduceData(name=name, partition_data=[
            Produce.PartitionProduceData(index=p, records=f"{name}{p}".encode()) for p in parts]))
    return Produce(acks=-1, timeout_ms=1000, topic_data=topics), leaders


@settings(max_examples=200, deadline=None)
@given(produce_requests())
def test_each_partition_goes_to_its_leader_once_with_its_own_batch(case: tuple[Produce, dict[tuple[str, int], int]]) -> None:
    request, leaders = case
    cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": "h:1"}))
    cluster.leaders = {key: Leadership(node, 0) for key, node in leaders.items()}
    by_node, unroutable = asyncio.run(Forwarder(cluster)._split(request, PRODUCE))
    assert unroutable == set()
    seen = []
    for node, topics in by_node.items():
        for topic in topics:
            indexes = [p.index for p in topic.partition_data]
            # Within a topic, a leader's partitions keep the client's order.
            original = [p.index for t in request.topic_data if t.name == topic.name for p in t.partition_data]
            assert indexes == [i for i in original if i in indexes]
            for p in topic.partition_data:
                assert leaders[(topic.name, p.index)] == node
                assert p.records == f"{topic.name}{p.index}".encode()  # the same bytes, not a re-encoding
                seen.append((topic.name, p.index))
    assert sorted(seen) == sorted(leaders)
    # The client's request itself is left as it was (it is merged against afterwards).
    assert sorted((t.name, p.index) for t in request.topic_data for p in t.partition_data) == sorted(leaders)
