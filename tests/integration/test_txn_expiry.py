"""Producer ids and transactional ids over time, through the real broker: an idempotent InitProducerId
gets a fresh producer id (never the one the client names), a retried KIP-360 InitProducerId gets the
same answer, and idle transactional ids (transactional.id.expiration.ms) and producers
(producer.id.expiration.ms) are forgotten, as Kafka does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .names import unique_name

EXPIRY = ["transactional.id.expiration.ms=1000", "transaction.remove.expired.transaction.cleanup.interval.ms=200",
          "producer.id.expiration.ms=1000", "producer.id.expiration.check.interval.ms=200"]


def _init(wire: WireClient, txn_id: str | None, pid: int = -1, epoch: int = -1) -> Any:
    return wire.request(ApiKey.INIT_PRODUCER_ID, 4, messages.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout_ms=30_000, producer_id=pid, producer_epoch=epoch))


def test_init_producer_id_allocation_and_retries(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        with WireClient.connect(proc.bootstrap) as wire:
            first = _init(wire, None)
            assert first.error_code == ErrorCode.NONE
            # An idempotent producer naming its id (and any other id) still gets a fresh one.
            again = _init(wire, None, first.producer_id, first.producer_epoch)
            assert again.error_code == ErrorCode.NONE
            assert again.producer_id != first.producer_id and again.producer_epoch == 0
            assert _init(wire, None, 123_456, 3).producer_id not in (123_456, first.producer_id, again.producer_id)

            txn_id = unique_name("kip360")
            txn = _init(wire, txn_id)
            bump = _init(wire, txn_id, txn.producer_id, txn.producer_epoch)
            retry = _init(wire, txn_id, txn.producer_id, txn.producer_epoch)
            assert (bump.error_code, retry.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
            assert (retry.producer_id, retry.producer_epoch) == (bump.producer_id, bump.producer_epoch)
            assert bump.producer_epoch == txn.producer_epoch + 1
    finally:
        proc.stop()


def _describe_state(wire: WireClient, txn_id: str) -> Any:
    return wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, messages.DescribeTransactionsRequest(
        transactional_ids=[txn_id])).transaction_states[0]


def test_idle_transactional_ids_and_producer_ids_expire(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides=EXPIRY).start()
    try:
        topic = unique_name("expiry")
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        txn_id = unique_name("idle")
        producer = Producer({"bootstrap.servers": proc.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"v", partition=0)
        producer.commit_transaction(30)
        with WireClient.connect(proc.bootstrap) as wire:
            pid = _describe_state(wire, txn_id).producer_id
            deadline = time.monotonic() + 60
            while _describe_state(wire, txn_id).error_code != ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                assert time.monotonic() < deadline, "the transactional id never expired"
                time.sleep(0.2)
            # A new incarnation starts afresh, with a new producer id.
            assert _init(wire, txn_id).producer_id != pid

        kp: Any = KafkaAdminClient(bootstrap_servers=proc.bootstrap)
        try:
            tp = KpTopicPartition(topic, 0)
            deadline = time.monotonic() + 60
            while kp.describe_producers([tp])[tp].active_producers:
                assert time.monotonic() < deadline, "the producer id never expired"
                time.sleep(0.2)
        finally:
            kp.close()
        assert "producer ids expired" in proc.log_text()
    finally:
        proc.stop()
