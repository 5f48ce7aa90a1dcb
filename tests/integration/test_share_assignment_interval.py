"""KIP-1263 assignment batching with confluent-kafka's ShareConsumer: a small share.assignment.interval.ms."""

from __future__ import annotations

import threading
import time
import uuid

from shoal.client.admin import Admin

from .broker_process import BrokerProcess
from .share_clients import Consumed, create_topic, poll_until, produce, set_group_config, share_consumer

DEADLINE_S = 60


def test_members_joining_within_the_interval_converge_and_consume_once(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = f"ai-{uuid.uuid4().hex[:8]}", f"aig-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 2)
    set_group_config(bs, group, share_auto_offset_reset="earliest", share_assignment_interval_ms="300")
    produced = produce(bs, topic, 600, partitions=2)
    # Three members join at once, so their joins fall within one interval: the later ones wait for the
    # next computation, which a heartbeat after the interval makes.
    sinks = [Consumed() for _ in range(3)]
    consumers = [share_consumer(bs, group, [topic], max_poll_records=20) for _ in range(3)]
    total = lambda: sum(len(s) for s in sinks)  # noqa: E731
    threads = [
        threading.Thread(target=poll_until, args=(c, lambda: total() >= 600, s, DEADLINE_S,
                                                  lambda _m: time.sleep(0.002)))
        for c, s in zip(consumers, sinks, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admin = Admin(bs)
    try:
        # Every member ends up on the latest target assignment.
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for c in consumers:
                c.poll(0.2)
            d = admin.describe_share_groups([group])[group]
            converged = (len(d.members) == 3 and d.assignment_epoch == d.group_epoch
                         and all(m.member_epoch == d.group_epoch for m in d.members))
            if converged or time.monotonic() > deadline:
                break
        assert converged, d
        assigned = {tp for m in d.members for tp in m.assignment}
        assert assigned == {(topic, 0), (topic, 1)}
    finally:
        admin.close()
        for c in consumers:
            c.close()
    got = [(p, o) for s in sinks for p, o, _v, _d in s.records]
    assert len(got) == len(set(got)), "a record was delivered twice"
    assert set(got) == {(p, o) for p, o, _v in produced}
