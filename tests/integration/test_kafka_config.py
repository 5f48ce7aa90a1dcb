"""Apache Kafka's own server.properties starts Shoal: Kafka keys that do not apply are logged once as
ignored, the KRaft controller listener is not served, and clients are told the advertised address."""

from __future__ import annotations

from pathlib import Path

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey

from .broker_process import BrokerProcess
from .kafka_wire import WireClient

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kafka-4-server.properties"
IGNORED = ("process.roles", "controller.quorum.bootstrap.servers", "num.network.threads", "num.io.threads",
           "num.recovery.threads.per.data.dir")


def test_kafka_stock_server_properties_start_the_broker(tmp_path: Path) -> None:
    text = FIXTURE.read_text()
    assert "listeners=PLAINTEXT://:9092,CONTROLLER://:9093\n" in text and "log.dirs=/tmp/kraft-combined-logs\n" in text
    text = text.replace("listeners=PLAINTEXT://:9092,CONTROLLER://:9093\n",
                        "listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0\n", 1)
    text = text.replace("log.dirs=/tmp/kraft-combined-logs\n", f"log.dirs={tmp_path / 'data'}\n")
    config = tmp_path / "server.properties"
    config.write_text(text)
    broker = BrokerProcess(tmp_path / "data", config_file=config).start()
    try:
        assert list(broker.ports) == ["PLAINTEXT"]  # the controller listener is not served
        log = broker.log_text()
        for key in IGNORED:
            assert log.count(f"key={key} ") == 1, key
        assert "isn't a known config" not in log
        with WireClient.connect(broker.bootstrap) as wire:
            meta = wire.request(ApiKey.METADATA, 12, messages.MetadataRequest(
                topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            # As Kafka does, the broker names itself by the file's advertised.listeners.
            assert [(b.node_id, b.host, b.port) for b in meta.brokers] == [(1, "localhost", 9092)]
    finally:
        broker.stop()
