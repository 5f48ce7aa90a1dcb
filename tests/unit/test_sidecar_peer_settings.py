"""The client settings one sidecar uses for its share-state requests to another (inter-broker traffic):
which of the peer's listeners, and what it presents there, from Kafka's inter-broker keys."""

from __future__ import annotations

import pytest

from shoal.broker.common.config import BrokerConfig, ConfigError
from shoal.broker.upstream.peer_state_client import inter_broker_settings

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="peer" password="s3cret" '
        'user_peer="s3cret";')
TWO_LISTENERS = {"listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093",
                 "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT"}


def _settings(**keys: str) -> tuple[str, str, str | None, str | None, str | None, bool]:
    s = inter_broker_settings(BrokerConfig.from_strings({k.replace("_", "."): v for k, v in keys.items()}))
    c = s.client
    return s.listener, c.security_protocol, c.sasl_mechanism if c.uses_sasl else None, c.sasl_username, \
        c.sasl_password, s.any_listener


def test_nothing_set_is_the_plaintext_listener_else_the_first() -> None:
    assert _settings(listeners="PLAINTEXT://127.0.0.1:9092") == ("PLAINTEXT", "PLAINTEXT", None, None, None, False)
    first = _settings(listeners="CLIENT://127.0.0.1:9092", listener_security_protocol_map="CLIENT:PLAINTEXT")
    assert first == ("CLIENT", "PLAINTEXT", None, None, None, True)


def test_the_named_listener_with_its_own_sasl_credentials() -> None:
    keys = {**TWO_LISTENERS, "inter.broker.listener.name": "internal", "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.internal.plain.sasl.jaas.config": JAAS}
    s = inter_broker_settings(BrokerConfig.from_strings(keys))
    assert (s.listener, s.any_listener) == ("INTERNAL", False)
    assert (s.client.security_protocol, s.client.sasl_mechanism) == ("SASL_PLAINTEXT", "PLAIN")
    assert (s.client.sasl_username, s.client.sasl_password) == ("peer", "s3cret")


def test_security_inter_broker_protocol_names_the_listener_after_its_protocol() -> None:
    keys = {"listeners": "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093",
            "security.inter.broker.protocol": "SASL_SSL", "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                'org.apache.kafka.common.security.scram.ScramLoginModule required username="peer" password="p";',
            "listener.name.sasl_ssl.ssl.keystore.location": "/etc/shoal/peer.pem",
            "listener.name.sasl_ssl.ssl.truststore.location": "/etc/shoal/ca.pem",
            "ssl.endpoint.identification.algorithm": ""}
    c = inter_broker_settings(BrokerConfig.from_strings(keys)).client
    assert (c.security_protocol, c.sasl_mechanism, c.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512", "peer")
    # The listener's truststore checks the peer; its keystore (PEM: chain and key) is the client certificate.
    assert c.ssl_ca_location == "/etc/shoal/ca.pem"
    assert c.ssl_certificate_location == c.ssl_key_location == "/etc/shoal/peer.pem"
    assert c.ssl_check_hostname is False


@pytest.mark.parametrize(("keys", "message"), [
    ({**TWO_LISTENERS, "inter.broker.listener.name": "INTERNAL", "security.inter.broker.protocol": "PLAINTEXT"},
     "Only one of"),
    ({**TWO_LISTENERS, "inter.broker.listener.name": "REPLICATION"}, "REPLICATION is not one of listeners"),
    ({**TWO_LISTENERS, "inter.broker.listener.name": "INTERNAL", "listener.name.internal.plain.sasl.jaas.config": JAAS},
     "sasl.mechanism.inter.broker.protocol must be one of"),  # Kafka's default, GSSAPI
    ({**TWO_LISTENERS, "inter.broker.listener.name": "INTERNAL", "sasl.mechanism.inter.broker.protocol": "PLAIN",
      "listener.name.internal.plain.sasl.jaas.config":
          'org.apache.kafka.common.security.plain.PlainLoginModule required user_peer="s3cret";'},
     "needs username"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093", "security.inter.broker.protocol": "SSL",
      "listener.name.ssl.ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----",
      "listener.name.ssl.ssl.keystore.key": "-----BEGIN PRIVATE KEY-----"},
     "reads its certificates from files"),
])
def test_a_configured_inter_broker_listener_that_cannot_work_stops_start_up(keys: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        inter_broker_settings(BrokerConfig.from_strings(keys))


def test_nothing_set_and_a_sasl_first_listener_starts_without_credentials() -> None:
    # As before these keys were read: the requests to other sidecars then fail, and say so in the log.
    s = inter_broker_settings(BrokerConfig.from_strings({"listeners": "SASL_PLAINTEXT://127.0.0.1:9092"}))
    assert (s.listener, s.client.security_protocol, s.any_listener) == ("SASL_PLAINTEXT", "PLAINTEXT", True)
