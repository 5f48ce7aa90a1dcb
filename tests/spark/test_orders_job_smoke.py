"""Smoke test of the example job as a user runs it: `python examples/spark_orders_job.py --available-now`
in a process of its own, against the broker (the docker-compose `tests` service runs it against shoal:9092)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shoal.client.producer import Producer
from tests.integration.external import ExternalBroker
from tests.integration.names import unique_name
from tests.integration.share_clients import Consumed, create_topic, poll_until, share_consumer

from .conftest import spark_env
from .test_spark_sink import EXAMPLE, _load_example

ORDERS = 30


@pytest.mark.external
def test_example_job_available_now_drains_the_queue_into_its_output_topic(
    broker: ExternalBroker, tmp_path: Path
) -> None:
    job = _load_example()
    source, sink, group = unique_name("smoke-orders"), unique_name("smoke-priced"), unique_name("smoke-spark")
    create_topic(broker.bootstrap, source, 2)
    items = ["widget", "gadget", "gizmo", "sprocket"]
    orders = [f"{items[i % 4]},{i % 7}" for i in range(ORDERS)]
    with Producer(broker.bootstrap) as producer:
        futures = [producer.send(source, order.encode(), partition=i % 2) for i, order in enumerate(orders)]
        producer.flush()
        assert all(f.result().offset >= 0 for f in futures)

    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--bootstrap", broker.bootstrap, "--source", source, "--sink", sink,
         "--group", group, "--partitions", "2", "--checkpoint", str(tmp_path / "ckpt"), "--available-now",
         "--master", "local[1]"],
        env={**os.environ, **spark_env()}, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]

    # The job set `earliest` only for its own group; the checking group needs it too.
    job.ensure_topics(broker.bootstrap, source, sink, group + "-check", 2)
    consumer = share_consumer(broker.bootstrap, group + "-check", [sink])
    got = Consumed()
    values: list[str] = []

    def keep(msg: Any) -> None:
        values.append(msg.value().decode())

    try:
        poll_until(consumer, lambda: len(got) >= ORDERS, got, timeout=60, on_message=keep)
    finally:
        consumer.close()
    expected = []
    for order in orders:
        item, qty = order.split(",")
        price = job.UNIT_PRICES.get(item)
        expected.append(f"{item},{qty},{float(round(price * int(qty), 2)) if price is not None else -1.0}")
    assert sorted(values) == sorted(expected)  # every order priced, exactly once
