"""The example Spark job (examples/spark_orders_job.py) as a deployed stack runs it, seen from the host:
orders go into its queue, and its output topic is read in a share group of the test's own."""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from shoal.client.producer import Producer
from tests.integration.share_clients import Consumed, poll_until, share_consumer
from tests.spark.test_spark_sink import _load_example

from .stack import ENABLE_ENV

JOB_TOPICS = ("orders", "orders-priced", "orders-spark")  # the example job's defaults, as the services run it
JOB_PARTITIONS = 3  # the job's default for the topics it creates
# Waits for a deployment on a loaded 2-core machine (JVM start-up, Spark's first micro-batch): deadlines, not
# measurements.
WAIT_S = 600
# Both stack modules: skipped without an engine; image builds and container start-ups on a loaded machine
# get a deadline well past the waits inside.
COMPOSE_MARKS = [
    pytest.mark.skipif(not os.environ.get(ENABLE_ENV),
                       reason=f"needs a Docker engine: `make compose-test` runs it ({ENABLE_ENV}=1)"),
    pytest.mark.timeout(3 * WAIT_S),
]


def load_job() -> ModuleType:
    return _load_example()


def start_checking(job: ModuleType, address: str, check_group: str) -> None:
    """The job creates its topics on start; so does this (whichever is first), and lets the checking group
    read from the start of the output topic."""
    source, sink, group = JOB_TOPICS
    job.ensure_topics(address, source, sink, group, JOB_PARTITIONS)
    job.ensure_topics(address, source, sink, check_group, JOB_PARTITIONS)


def priced(job: ModuleType, order: str) -> str:
    item, qty = order.split(",")
    price = job.UNIT_PRICES.get(item)
    return f"{item},{qty},{float(round(price * int(qty), 2)) if price is not None else -1.0}"


def produce_orders(address: str, orders: list[str]) -> None:
    with Producer(address) as producer:
        futures = [producer.send(JOB_TOPICS[0], order.encode(), partition=i % JOB_PARTITIONS)
                   for i, order in enumerate(orders)]
        producer.flush()
        assert all(f.result(60).offset >= 0 for f in futures)


def wait_priced(address: str, group: str, expected: set[str], seen: set[str]) -> None:
    """Read the job's output topic in a share group of the test's own until every expected value was seen."""
    consumer = share_consumer(address, group, [JOB_TOPICS[1]])
    got = Consumed()
    try:
        poll_until(consumer, lambda: expected <= seen, got, timeout=WAIT_S,
                   on_message=lambda msg: seen.add(msg.value().decode()))
    finally:
        consumer.close()
    assert expected <= seen, f"not priced: {sorted(expected - seen)}"
