"""A Quix Streams application that declares a topic with extra topic configs, as its users do, and writes one
message to it. Runs in the Quix venv (.venv-quix): argv is bootstrap, topic, state dir, then key=value configs."""

from __future__ import annotations

import sys

from quixstreams import Application
from quixstreams.models.topics import TopicConfig


def main() -> None:
    bootstrap, name, state_dir, *pairs = sys.argv[1:]
    extra = dict(pair.split("=", 1) for pair in pairs)
    app = Application(broker_address=bootstrap, consumer_group=f"{name}-app", state_dir=state_dir,
                      auto_create_topics=True)
    # Declaring the topic creates it with the extra configs (Quix Streams' TopicManager).
    topic = app.topic(name, value_serializer="json",
                      config=TopicConfig(num_partitions=1, replication_factor=1, extra_config=extra))
    with app.get_producer() as producer:
        msg = topic.serialize(key=b"k", value={"n": 1})
        producer.produce(topic=topic.name, key=msg.key, value=msg.value)
    print("produced", flush=True)


if __name__ == "__main__":
    main()
