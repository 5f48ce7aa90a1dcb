"""Dead-letter topics for share groups (KIP-1191) and the Kafka 4.3 group configs, with real clients."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from shoal.client import ShareConsumer as BundledShareConsumer
from shoal.client.admin import RESOURCE_BROKER, Admin
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .share_clients import create_topic, produce, reject_confirmed, set_group_config, share_consumer
from .test_metrics import scrape
from .test_share_admin_metrics import delta

DEADLINE_S = 60


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create_dlq_topic(bootstrap: str, name: str, *, enabled: bool = True) -> None:
    create_topic(bootstrap, name, 1, {"errors.deadletterqueue.group.enable": "true"} if enabled else None)


def _dead_letters(bootstrap: str, topic: str, at_least: int) -> list[Any]:
    """Every record of partition 0 of `topic` once it holds at least `at_least` (up to its end)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("reader"),
                         "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            if high >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[Any] = []
        while len(out) < high and time.monotonic() < deadline:
            out.extend(m for m in consumer.consume(100, 1.0) if not m.error())
        return out
    finally:
        consumer.close()


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


def _settle(consumer: Any, how: AcknowledgeType, count: int) -> list[Any]:
    """Poll until `count` records were delivered, settle each with `how`, commit; returns them."""
    got: list[Any] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        msgs = [m for m in consumer.poll(0.5) if not m.error()]
        for m in msgs:
            consumer.acknowledge(m, how)
        if msgs:
            assert all(v is None for v in consumer.commit_sync(30).values())
            got.extend(msgs)
    return got


def _reject_one(bootstrap: str, topic: str, group: str) -> None:
    """Produce one record to `topic` and REJECT it as a member of `group`."""
    produce(bootstrap, topic, 1)
    consumer = share_consumer(bootstrap, group, [topic], share_acknowledgement_mode="explicit")
    try:
        assert len(_settle(consumer, AcknowledgeType.REJECT, 1)) == 1
    finally:
        consumer.close()


@pytest.mark.parametrize("copy", [False, True])
def test_rejected_record_is_dead_lettered_once_with_headers(broker: BrokerProcess, copy: bool) -> None:
    bs = broker.bootstrap
    topic, group = _name("dq"), _name("dg")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq,
                     errors_deadletterqueue_copy_record_enable=str(copy).lower())
    produce(bs, topic, 2)
    before, _types = scrape(broker)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    try:
        got: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 2 and time.monotonic() < deadline:
            for m in consumer.poll(0.5):
                if not m.error():
                    consumer.acknowledge(m, AcknowledgeType.REJECT if m.offset() == 0 else AcknowledgeType.ACCEPT)
                    got.append(m)
            if got:
                res = consumer.commit_sync(30)
                assert all(v is None for v in res.values()), res
    finally:
        consumer.close()
    records = _dead_letters(bs, dlq, 1)
    assert len(records) == 1
    assert _headers(records[0]) == {
        "__dlq.errors.topic": topic,
        "__dlq.errors.partition": "0",
        "__dlq.errors.offset": "0",
        "__dlq.errors.group": group,
        "__dlq.errors.delivery.count": "1",
        "__dlq.errors.message": "Offset rejected by client.",
    }
    if copy:
        assert (records[0].key(), records[0].value()) == (b"0", b"v-0")
    else:
        assert (records[0].key(), records[0].value()) == (None, None)
    # KIP-1103 and KIP-1191 meters moved with this workload (the dead-letter meter moves after the fsync).
    deadline = time.monotonic() + DEADLINE_S
    after, _types = scrape(broker)
    while delta(before, after, "shoal_share_group_dead_letter_queue_records_total", group=group) < 1 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
        after, _types = scrape(broker)
    assert delta(before, after, "shoal_share_group_dead_letter_queue_records_total", group=group) == 1
    assert delta(before, after, "shoal_share_group_dead_letter_queue_produce_requests_total", group=group) == 1
    assert delta(before, after, "shoal_broker_topic_total_share_fetch_requests_total", topic=topic) >= 1
    assert delta(before, after, "shoal_broker_topic_total_share_acknowledgement_requests_total", topic=topic) >= 1
    assert delta(before, after, "shoal_broker_topic_failed_share_acknowledgement_requests_total", topic=topic) == 0


@pytest.mark.external
def test_released_to_the_delivery_limit_is_dead_lettered(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("dr"), _name("dg")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_delivery_count_limit="2",
                     errors_deadletterqueue_topic_name=dlq)
    produce(bs, topic, 1)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    try:
        for _attempt in range(2):
            assert len(_settle(consumer, AcknowledgeType.RELEASE, 1)) == 1
    finally:
        consumer.close()
    records = _dead_letters(bs, dlq, 1)
    assert len(records) == 1
    headers = _headers(records[0])
    assert headers["__dlq.errors.delivery.count"] == "2"
    assert headers["__dlq.errors.message"] == "Offset delivery count exceeded the threshold."


def _refused(bootstrap: str, group: str, message: str, *, validate_only: bool = False, **configs: str) -> None:
    with pytest.raises(KafkaException) as info:
        set_group_config(bootstrap, group, validate_only=validate_only, **configs)
    err = info.value.args[0]
    assert err.code() == ErrorCode.INVALID_CONFIG, (configs, err)
    assert message in err.str(), (configs, err.str())


def _group_configs(bootstrap: str, group: str) -> dict[str, tuple[str | None, int]]:
    """name -> (value, source) of the group's configs, as confluent's AdminClient describes them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    return {k: (e.value, e.source) for k, e in future.result(30).items()}


def test_bad_group_configs_are_refused(broker: BrokerProcess) -> None:
    group = _name("dv")
    for key, value, message in (
        ("errors.deadletterqueue.topic.name", "__internal", "DLQ topic name must not start with '__'"),
        ("errors.deadletterqueue.copy.record.enable", "sometimes", "Expected value to be either true or false"),
        ("share.renew.acknowledge.enable", "maybe", "either true or false"),
        ("share.assignment.interval.ms", "20000", "20000"),
    ):
        _refused(broker.bootstrap, group, message, **{key.replace(".", "_"): value})


def test_dead_letter_topic_is_checked_when_the_group_config_is_set(broker: BrokerProcess) -> None:
    """Stricter than Kafka 4.4, which checks the prefix and the opt-in only when it dead-letters."""
    bs = broker.bootstrap
    group = _name("dc")
    plain, off, on, later = _name("plain"), f"dlq.{_name('off')}", f"dlq.{_name('on')}", f"dlq.{_name('later')}"
    _create_dlq_topic(bs, plain)  # opted in, but without the prefix
    _create_dlq_topic(bs, off, enabled=False)
    _create_dlq_topic(bs, on)
    for name, message in (
        (plain, f"The dead-letter topic name '{plain}' must start with the prefix 'dlq.'"),
        (f"x{later}", "must start with the prefix 'dlq.'"),
        (off, f"Topic '{off}' is not enabled as a dead-letter topic for share groups "
              "(errors.deadletterqueue.group.enable=false)"),
    ):
        for validate_only in (True, False):
            _refused(bs, group, message, validate_only=validate_only, errors_deadletterqueue_topic_name=name)
    # Nothing was kept, not even by the requests that were not validateOnly.
    assert _group_configs(bs, group)["errors.deadletterqueue.topic.name"][1] == ConfigSource.DEFAULT_CONFIG.value
    # An opted-in topic, and a prefixed one that does not exist yet (created later or automatically).
    for name in (on, later):
        set_group_config(bs, group, validate_only=True, errors_deadletterqueue_topic_name=name)
        set_group_config(bs, group, errors_deadletterqueue_topic_name=name)
        value, source = _group_configs(bs, group)["errors.deadletterqueue.topic.name"]
        assert (value, source) == (name, ConfigSource.GROUP_CONFIG.value)
    admin = AdminClient({"bootstrap.servers": bs})
    assert later not in admin.list_topics(timeout=30).topics  # accepting the name created nothing


def _wait_logged(broker: BrokerProcess, *parts: str) -> None:
    """Until one line of the broker's log holds every part."""
    def found() -> bool:
        return any(all(p in line for p in parts) for line in broker.log_text().splitlines())

    deadline = time.monotonic() + DEADLINE_S
    while not found() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found(), parts


def test_a_dead_letter_topic_that_changed_after_the_config_archives_without_a_record(broker: BrokerProcess) -> None:
    """As in Kafka, the prefix and the opt-in are checked again when a record is dead-lettered: the leader
    archives the record anyway and says why."""
    bs = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})

    def opt_out(dlq: str) -> None:
        entry = ConfigEntry("errors.deadletterqueue.group.enable", "false", incremental_operation=AlterConfigOpType.SET)
        for future in admin.incremental_alter_configs(
                [ConfigResource(ResourceType.TOPIC, dlq, incremental_configs=[entry])]).values():
            future.result(30)

    def new_prefix(_dlq: str) -> None:
        _alter_broker(bs, "1", errors_deadletterqueue_topic_name_prefix="other.")

    try:
        for change, reason in ((opt_out, "DLQ is not enabled on configured DLQ topic"),
                               (new_prefix, "does not comply with the DLQ topic prefix")):
            topic, group = _name("dn"), _name("dg")
            dlq = f"dlq.{topic}"
            create_topic(bs, topic, 1)
            _create_dlq_topic(bs, dlq)
            set_group_config(bs, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
            change(dlq)
            _reject_one(bs, topic, group)
            _wait_logged(broker, reason, f"share group: {group}")
            assert _dead_letters(bs, dlq, 0) == []
    finally:
        # The module's broker is shared: back to the default prefix.
        error = _alter_broker_bundled(bs, "1", errors_deadletterqueue_topic_name_prefix=None)
        assert error is None, error


def test_renew_refused_when_the_group_disables_it(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("rn"), _name("rg")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_renew_acknowledge_enable="false")
    produce(bs, topic, 1)
    before, _types = scrape(broker)
    with BundledShareConsumer(bs, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        got: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while not got and time.monotonic() < deadline:
            got = consumer.poll(0.5)
        assert len(got) == 1
        consumer.acknowledge(got[0], "renew")
        result = consumer.commit_sync(30)[(topic, 0)]
        assert result is not None and result.code == ErrorCode.INVALID_RECORD_STATE
        # The record is unchanged: still ours, with its first delivery, and can be accepted.
        consumer.acknowledge(got[0], "accept")
        assert consumer.commit_sync(30) == {(topic, 0): None}
    after, _types = scrape(broker)
    assert delta(before, after, "shoal_broker_topic_failed_share_acknowledgement_requests_total", topic=topic) == 1


def test_kill_while_dead_lettering_loses_none_and_writes_none_twice(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = _name("dk"), _name("dg")
    dlq = f"dlq.{topic}"
    count = 300
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce(bs, topic, count)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit", max_poll_records=20)
    killed = False

    def crash_once(rejected: set[int]) -> None:
        nonlocal killed
        if not killed and len(rejected) >= 60:
            # Crash right behind answered rejections, whose dead-letter writes are under way.
            fresh_broker.kill()
            killed = True
            fresh_broker.start()

    try:
        rejected = reject_confirmed(consumer, count, 120, crash_once)
    finally:
        consumer.close()
    assert killed
    assert rejected == set(range(count))
    records = _dead_letters(bs, dlq, count)
    offsets = [int(_headers(r)["__dlq.errors.offset"]) for r in records]
    assert sorted(offsets) == list(range(count))


def _alter_broker(bootstrap: str, name: str, **configs: str) -> None:
    """confluent's AdminClient for this broker's id; the cluster-wide resource ("") through the bundled
    admin client, as confluent's ConfigResource refuses an empty name."""
    if not name:
        error = _alter_broker_bundled(bootstrap, name, **configs)
        assert error is None, error
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(key.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
               for key, value in configs.items()]
    resource = ConfigResource(ResourceType.BROKER, name, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _alter_broker_bundled(bootstrap: str, name: str, **configs: str | None) -> Any:
    """The bundled admin client sends a BROKER resource to any broker (confluent's only to that id)."""
    with contextlib.closing(Admin(bootstrap)) as bundled:
        return bundled.incremental_alter_configs(RESOURCE_BROKER, name, {k.replace("_", "."): v for k, v in configs.items()})


def _describe_broker(bootstrap: str, name: str) -> dict[str, tuple[str | None, int, bool]]:
    """name -> (value, source, read-only)."""
    if name:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        [future] = admin.describe_configs([ConfigResource(ResourceType.BROKER, name)]).values()
        return {k: (e.value, e.source, e.is_read_only) for k, e in future.result(30).items()}
    with contextlib.closing(Admin(bootstrap)) as bundled:
        described = bundled.describe_configs(RESOURCE_BROKER, "")
    return {k: (e.value, e.source, e.read_only) for k, e in described.entries.items()}


def test_dead_letter_broker_keys_change_at_runtime(fresh_broker: BrokerProcess) -> None:
    """KIP-1191's broker keys are dynamic cluster configs (Kafka 4.4): IncrementalAlterConfigs on BROKER."""
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    # Cluster-wide: a new prefix and automatic creation; the broker's own id may override the default.
    _alter_broker(bs, "", errors_deadletterqueue_topic_name_prefix="dead.",
                  errors_deadletterqueue_auto_create_topics_enable="true")
    _alter_broker(bs, "1", errors_deadletterqueue_topic_name_prefix="gone.")
    default = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert _describe_broker(bs, "") == {
        "errors.deadletterqueue.auto.create.topics.enable": ("true", default, False),
        "errors.deadletterqueue.topic.name.prefix": ("dead.", default, False),
    }
    own = _describe_broker(bs, "1")
    assert own["errors.deadletterqueue.topic.name.prefix"] == ("gone.", ConfigSource.DYNAMIC_BROKER_CONFIG.value, False)
    assert own["errors.deadletterqueue.auto.create.topics.enable"] == ("true", default, False)
    assert own["auto.create.topics.enable"][2]
    # Keys Kafka does not change at runtime, and another broker's id, are refused as Kafka refuses them.
    for name, key, message in (("", "auto.create.topics.enable", "Cannot update these configs dynamically"),
                               ("7", "errors.deadletterqueue.topic.name.prefix", "Unexpected broker id"),
                               ("--7", "errors.deadletterqueue.topic.name.prefix", "Node id must be an integer"),
                               ("", "errors.deadletterqueue.auto.create.topics.enable", "either true or false")):
        error = _alter_broker_bundled(bs, name, **{key.replace(".", "_"): "maybe"})
        assert error is not None and error.code == ErrorCode.INVALID_REQUEST, (key, error)
        assert message in str(error.message), (key, error)

    # The broker's own value wins and is used at once: the missing dead-letter topic is created.
    topic, group = _name("dy"), _name("dg")
    dlq = f"gone.{topic}"
    create_topic(bs, topic, 1)
    # The group config is checked against the prefix in force now.
    _refused(bs, group, "must start with the prefix 'gone.'", errors_deadletterqueue_topic_name=f"dlq.{topic}")
    set_group_config(bs, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    _reject_one(bs, topic, group)
    [record] = _dead_letters(bs, dlq, 1)
    assert _headers(record)["__dlq.errors.group"] == group
    # Dynamic values survive a restart.
    fresh_broker.stop()
    fresh_broker.start()
    own = _describe_broker(fresh_broker.bootstrap, "1")
    assert own["errors.deadletterqueue.topic.name.prefix"][:2] == ("gone.", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert own["errors.deadletterqueue.auto.create.topics.enable"][:2] == ("true", default)


def _delivered_once(consumer: Any, how: AcknowledgeType) -> Any:
    """Poll until one record comes, settle it with `how`, commit; returns it."""
    [msg] = _settle(consumer, how, 1)
    return msg


def test_a_reject_on_the_last_allowed_delivery_is_labelled_a_rejection(broker: BrokerProcess) -> None:
    """The header carries the cause of the transition that archived the record, not a guess from its
    delivery count: a REJECT on delivery 2 of 2 is "rejected", a RELEASE there is "count exceeded"."""
    bs = broker.bootstrap
    topic, group = _name("dz"), _name("dg")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_delivery_count_limit="2",
                     errors_deadletterqueue_topic_name=dlq)
    produce(bs, topic, 2)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit", max_poll_records=1)
    try:
        settled: dict[int, int] = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(settled) < 2 and time.monotonic() < deadline:
            for m in [m for m in consumer.poll(0.5) if not m.error()]:
                if m.delivery_count() < 2:
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)
                else:  # the last allowed delivery: offset 0 is rejected, offset 1 released
                    consumer.acknowledge(m, AcknowledgeType.REJECT if m.offset() == 0 else AcknowledgeType.RELEASE)
                    settled[m.offset()] = m.delivery_count()
                assert all(v is None for v in consumer.commit_sync(30).values())
        assert settled == {0: 2, 1: 2}
    finally:
        consumer.close()
    records = _dead_letters(bs, dlq, 2)
    by_offset = {_headers(r)["__dlq.errors.offset"]: _headers(r) for r in records}
    assert {o: (h["__dlq.errors.delivery.count"], h["__dlq.errors.message"]) for o, h in by_offset.items()} == {
        "0": ("2", "Offset rejected by client."),
        "1": ("2", "Offset delivery count exceeded the threshold."),
    }


def test_records_over_a_lowered_delivery_limit_are_dead_lettered(broker: BrokerProcess) -> None:
    """Released twice under a limit of 5, then the limit goes down to 2 (AdminClient): the next fetch
    dead-letters the record instead of archiving it silently, and never delivers it again."""
    bs = broker.bootstrap
    topic, group = _name("dl"), _name("dg")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_delivery_count_limit="5",
                     errors_deadletterqueue_topic_name=dlq)
    produce(bs, topic, 1)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    try:
        for attempt in (1, 2):
            assert _delivered_once(consumer, AcknowledgeType.RELEASE).delivery_count() == attempt
        set_group_config(bs, group, share_delivery_count_limit="2")
        # A record produced after it shows that fetches go on, and that offset 0 is not among them.
        produce(bs, topic, 1, prefix="after")
        later = _delivered_once(consumer, AcknowledgeType.ACCEPT)
        assert (later.offset(), later.value()) == (1, b"after-0")
    finally:
        consumer.close()
    [record] = _dead_letters(bs, dlq, 1)
    headers = _headers(record)
    assert (headers["__dlq.errors.offset"], headers["__dlq.errors.delivery.count"], headers["__dlq.errors.message"]) \
        == ("0", "2", "Offset delivery count exceeded the threshold.")


def test_a_share_consumer_long_polling_the_dead_letter_topic_is_woken(broker: BrokerProcess) -> None:
    """The dead-letter append wakes long polls on its partition, as a produce does. The reader's MaxWaitMs is
    far beyond the test's deadline, so only that wake-up can deliver the record in time."""
    bs = broker.bootstrap
    topic, group, reader_group = _name("dw"), _name("dg"), _name("dr")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    set_group_config(bs, reader_group, share_auto_offset_reset="earliest")
    reader = share_consumer(bs, reader_group, [dlq], share_acknowledgement_mode="explicit",
                            fetch_wait_max_ms=120_000)
    try:
        # Joined, assigned, and parked in a ShareFetch on the empty dead-letter partition (not asserted on:
        # the fetch is parked whether or not it arrived before the reject below).
        assert [m for m in reader.poll(3.0) if not m.error()] == []
        _reject_one(bs, topic, group)
        got: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while not got and time.monotonic() < deadline:
            got = [m for m in reader.poll(0.5) if not m.error()]
        assert [(_headers(m)["__dlq.errors.topic"], _headers(m)["__dlq.errors.offset"]) for m in got] == [(topic, "0")]
        for m in got:
            reader.acknowledge(m, AcknowledgeType.ACCEPT)
        assert all(v is None for v in reader.commit_sync(30).values())
    finally:
        reader.close()


def test_records_over_a_limit_lowered_while_the_broker_was_down_are_dead_lettered(fresh_broker: BrokerProcess) -> None:
    """The limit goes down, then the broker restarts before the share partition is used again: loading its
    state must dead-letter the AVAILABLE record already over the new limit, not archive it silently."""
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = _name("dp"), _name("dg")
    dlq = f"dlq.{topic}"
    create_topic(bs, topic, 1)
    _create_dlq_topic(bs, dlq)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_delivery_count_limit="5",
                     errors_deadletterqueue_topic_name=dlq)
    produce(bs, topic, 1)
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    try:
        for attempt in (1, 2):
            assert _delivered_once(consumer, AcknowledgeType.RELEASE).delivery_count() == attempt
    finally:
        consumer.close()
    set_group_config(bs, group, share_delivery_count_limit="2")
    fresh_broker.stop()
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    produce(bs, topic, 1, prefix="after")
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    try:
        later = _delivered_once(consumer, AcknowledgeType.ACCEPT)
        assert (later.offset(), later.value()) == (1, b"after-0")
    finally:
        consumer.close()
    [record] = _dead_letters(bs, dlq, 1)
    headers = _headers(record)
    assert (headers["__dlq.errors.offset"], headers["__dlq.errors.message"]) == \
        ("0", "Offset delivery count exceeded the threshold.")
