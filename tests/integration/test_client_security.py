"""The bundled clients over SSL, SASL_PLAINTEXT (PLAIN, SCRAM-SHA-512) and SASL_SSL (SCRAM-SHA-256)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shoal.client import (
    RESOURCE_GROUP,
    AcknowledgeType,
    Admin,
    NewTopic,
    Producer,
    ShareConsumer,
    ShareRecord,
)
from shoal.client.errors import AuthenticationError

from .broker_process import BrokerProcess
from .test_security import client_conf, ensure_scram_user, pki, secure_broker  # noqa: F401  (fixtures)


def _config(broker: BrokerProcess, pki_paths: dict[str, Path], kind: str) -> tuple[str, dict[str, str]]:
    conf = dict(client_conf(broker, pki_paths, kind))
    return conf.pop("bootstrap.servers"), conf


@pytest.mark.parametrize("kind", ["SSL", "PLAIN", "SCRAM-SHA-512", "SASL_SSL"])
def test_produce_and_share_consume_over_secure_listeners(
    secure_broker: BrokerProcess, pki: dict[str, Path], kind: str  # noqa: F811
) -> None:
    ensure_scram_user(secure_broker)
    topic, group = f"cl-sec-{kind.lower()}", f"cl-sec-{kind.lower()}-g"
    with Admin(secure_broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"})
    bootstrap, conf = _config(secure_broker, pki, kind)
    with Producer(bootstrap, config=conf) as producer:
        md = producer.send(topic, b"secret", key=b"k").result(30)
        assert md.offset == 0
    with ShareConsumer(bootstrap, group, acknowledgement_mode="explicit", config=conf) as consumer:
        consumer.subscribe([topic])
        got: list[ShareRecord] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.poll(0.5)
        assert [(r.key, r.value) for r in got] == [(b"k", b"secret")]
        consumer.acknowledge(got[0], AcknowledgeType.ACCEPT)
        assert consumer.commit_sync(30) == {(topic, 0): None}


def test_wrong_password_and_untrusted_server_are_refused(
    secure_broker: BrokerProcess, pki: dict[str, Path]  # noqa: F811
) -> None:
    bootstrap, conf = _config(secure_broker, pki, "PLAIN")
    with pytest.raises(AuthenticationError):
        Admin(bootstrap, config={**conf, "sasl.password": "wrong"})
    bootstrap, conf = _config(secure_broker, pki, "SASL_SSL")
    conf.pop("ssl.ca.location")  # the system trust store does not know the test CA
    with pytest.raises(AuthenticationError, match="TLS"):
        Admin(bootstrap, config=conf)
