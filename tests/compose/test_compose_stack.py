"""The main docker-compose stack (docker/docker-compose.yml) does what a deployment must survive, with the
real images and containers: `make compose-test` runs this module (it needs a Docker engine, so the plain
suite skips it).

- the broker container is restarted under the running example Spark job, which goes on pricing orders
  without a restart of its own (it reaches the broker by service name on the INTERNAL listener);
- `docker stop` and `docker start` of the broker keep topics, records, share-group state and committed
  offsets (the data directory is a named volume; the broker exits 0 on SIGTERM);
- the broker image runs the compiled record walk and fsync worker (the slim image has no compiler: the
  Dockerfile builds the wheel in a stage that has one).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.external import ExternalBroker
from tests.integration.kafka_wire import WireClient
from tests.integration.test_share_protocol import (
    ACCEPT,
    REJECT,
    RawShareMember,
    fetch_until,
    join,
    produce_batches,
    share_setup,
    state_summary,
    topic_id_of,
)

from .orders_job import COMPOSE_MARKS, WAIT_S, load_job, priced, produce_orders, start_checking, wait_priced
from .stack import Stack, docker, main_stack

pytestmark = COMPOSE_MARKS


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # One project per run: its own containers, network and volumes, whatever else runs on the engine.
    s = main_stack(os.environ.get("SHOAL_COMPOSE_PROJECT", f"shoal-deploy-{uuid.uuid4().hex[:8]}"))
    try:
        s.compose("up", "-d", "--build", "shoal", "spark-orders-job")
        s.wait_healthy("shoal")
        yield s
    finally:
        s.down()


def bootstrap(stack: Stack) -> str:
    """The PLAINTEXT listener, through the port published on 127.0.0.1 (advertised as localhost:<port>)."""
    return f"localhost:{stack.env['SHOAL_PORT']}"


def test_broker_restart_under_the_running_spark_job(stack: Stack) -> None:
    job = load_job()
    address = bootstrap(stack)
    check_group = f"orders-check-{uuid.uuid4().hex[:8]}"
    start_checking(job, address, check_group)
    first = [f"widget,{i}" for i in range(1, 21)]
    produce_orders(address, first)
    seen: set[str] = set()
    wait_priced(address, check_group, {priced(job, o) for o in first}, seen)

    job_before = stack.state("spark-orders-job")
    assert job_before[3], stack.logs("spark-orders-job")[-3000:]
    broker_id = stack.state("shoal")[0]
    stack.compose("restart", "shoal")
    stack.wait_healthy("shoal")
    assert stack.state("shoal")[0] == broker_id  # restarted, not re-created

    second = [f"gadget,{i}" for i in range(1, 21)]
    produce_orders(address, second)
    wait_priced(address, check_group, {priced(job, o) for o in first + second}, seen)
    # The same job container, never restarted: it rode out the broker's restart on its own.
    job_after = stack.state("spark-orders-job")
    assert job_after == job_before, (job_before, job_after, stack.logs("spark-orders-job")[-3000:])


def committed(address: str, group: str, topic: str, partitions: int) -> list[tuple[int, int, str | None]]:
    consumer = Consumer({"bootstrap.servers": address, "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return sorted((tp.partition, tp.offset, tp.metadata) for tp in tps)
    finally:
        consumer.close()


def read_all(address: str, topic: str, partitions: int, count: int) -> list[tuple[int, int, bytes]]:
    consumer = Consumer({"bootstrap.servers": address, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: list[tuple[int, int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + WAIT_S
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                out.append((msg.partition(), msg.offset(), msg.value()))
    finally:
        consumer.close()
    return sorted(out)


def test_the_broker_image_runs_the_compiled_extensions(stack: Stack) -> None:
    started = []
    for line in stack.logs("shoal").splitlines():
        _, brace, rest = line.partition("{")  # compose prefixes each line with the container's name
        if brace and '"broker started"' in rest:
            started.append(json.loads(brace + rest))
    assert started, stack.logs("shoal")[-3000:]
    assert all(e["compiled_record_walk"] and e["compiled_fsync_worker"] for e in started), started


def test_docker_stop_and_start_keep_topics_records_share_state_and_offsets(stack: Stack) -> None:
    address = bootstrap(stack)
    s = share_setup(ExternalBroker(address), members=1, partitions=2)  # type: ignore[arg-type]
    [a] = s.members
    offsets_group = f"offsets-{uuid.uuid4().hex[:8]}"
    try:
        for p in (0, 1):
            produce_batches(s.admin, s.topic, [10] * 3, partition=p)  # offsets 0-29 in both partitions
        # Partition 0: accept 0-9 and 15-19, reject 12, leave 10-11 and 13-14 acquired; partition 1: accept 0-29.
        assert fetch_until(a, [0], 20, max_records=20) == [(0, (0, 19, 1))]
        assert a.ack_codes({0: [(0, 9, [ACCEPT]), (12, 12, [REJECT]), (15, 19, [ACCEPT])]}) == {0: 0}
        assert fetch_until(a, [1], 30, max_records=30) == [(1, (0, 29, 1))]
        assert a.ack_codes({1: [(0, 29, [ACCEPT])]}) == {1: 0}
        share_before = state_summary(s.admin, s.group, s.topic_id, [0, 1])
        assert [(p, err, start) for p, err, _se, start, _dcc in share_before] == [(0, 0, 10), (1, 0, 30)]
    finally:
        s.close()
    committer = Consumer({"bootstrap.servers": address, "group.id": offsets_group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition(s.topic, 0, 17, metadata="m0"), TopicPartition(s.topic, 1, 23)],
                         asynchronous=False)
    finally:
        committer.close()
    offsets_before = committed(address, offsets_group, s.topic, 2)
    assert [(p, o) for p, o, _m in offsets_before] == [(0, 17), (1, 23)]
    records_before = read_all(address, s.topic, 2, 60)
    assert len(records_before) == 60

    broker_id = stack.state("shoal")[0]
    docker("stop", broker_id, timeout=120)
    stopped = stack.inspect("shoal")["State"]
    # SIGTERM reached the broker as PID 1 and it shut down cleanly (not SIGKILLed after the grace period).
    assert not stopped["Running"] and stopped["ExitCode"] == 0, (stopped, stack.logs("shoal")[-3000:])
    docker("start", broker_id)
    stack.wait_healthy("shoal")
    assert stack.state("shoal")[0] == broker_id

    with WireClient.connect(address) as admin:
        assert topic_id_of(admin, s.topic) == s.topic_id
        assert state_summary(admin, s.group, s.topic_id, [0, 1]) == share_before
    assert read_all(address, s.topic, 2, 60) == records_before
    assert committed(address, offsets_group, s.topic, 2) == offsets_before
    # A new member gets exactly what was neither accepted nor rejected before the stop (acquisitions are
    # not persisted, so 10-11 and 13-14 come back as first deliveries).
    c = RawShareMember(ExternalBroker(address), s.group, s.topic_id)  # type: ignore[arg-type]
    try:
        join(c.client, s.group, c.member_id, s.topic, s.topic_id, set())
        expected = {(0, o) for o in (10, 11, 13, 14, *range(20, 30))}
        got = fetch_until(c, [0, 1], len(expected))
        assert sorted((p, o) for p, (f, last, _dc) in got for o in range(f, last + 1)) == sorted(expected)
    finally:
        c.close()
