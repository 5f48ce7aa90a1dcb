"""The kafka-share sink, driven by the example job in examples/ (source -> transform -> sink)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import Consumed, poll_until, share_consumer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_orders_job.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_orders_job", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_example_job_prices_every_order_into_the_sink_topic(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    from shoal.client.producer import Producer

    job = _load_example()
    source, sink, group = "ex-orders", "ex-orders-priced", "ex-orders-spark"
    job.ensure_topics(broker.bootstrap, source, sink, group, 3)
    items = ["widget", "gadget", "gizmo", "sprocket"]
    orders = {f"o{i}": f"{items[i % 4]},{i % 7}" for i in range(400)}
    with Producer(broker.bootstrap) as producer:
        futures = [producer.send(source, v.encode(), key=k.encode()) for k, v in orders.items()]
        producer.flush()
        assert all(f.result().offset >= 0 for f in futures)

    query = job.build_query(
        spark, bootstrap=broker.bootstrap, source=source, sink=sink, group=group,
        checkpoint=str(tmp_path / "ckpt"), available_now=True, max_offsets_per_trigger=150,
    )
    query.awaitTermination(120)
    assert query.exception() is None

    # Read the sink topic back with an independent client (librdkafka's share consumer).
    out_group = "ex-orders-priced-check"
    job.ensure_topics(broker.bootstrap, source, sink, out_group, 3)
    consumer = share_consumer(broker.bootstrap, out_group, [sink])
    got = Consumed()
    messages: list[tuple[str, str, dict[str, bytes]]] = []

    def keep(msg: Any) -> None:
        messages.append((msg.key().decode(), msg.value().decode(), dict(msg.headers() or [])))

    try:
        poll_until(consumer, lambda: len(got) >= len(orders), got, timeout=60, on_message=keep)
    finally:
        consumer.close()
    expected = {}
    for key, text in orders.items():
        item, qty = text.split(",")
        price = job.UNIT_PRICES.get(item)
        total = round(price * int(qty), 2) if price is not None else -1.0
        expected[key] = f"{item},{qty},{float(total)}"
    assert sorted(k for k, _, _ in messages) == sorted(orders)  # each order priced exactly once
    assert {k: v for k, v, _ in messages} == expected
    # The job's header names the source record; every one is distinct.
    sources = {h["source"] for _, _, h in messages}
    assert len(sources) == len(orders) and all(s.startswith(source.encode() + b"-") for s in sources)
