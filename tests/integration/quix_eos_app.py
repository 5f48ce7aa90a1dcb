"""A Quix Streams exactly-once application: counts the records of each key of an input topic in a stateful
step and writes every new count to an output topic. Runs in the Quix venv (.venv-quix) until it is
stopped: argv is bootstrap, input topic, output topic, consumer group, state dir."""

from __future__ import annotations

import sys
import time
from typing import Any

from quixstreams import Application, State


def count(value: dict[str, Any], state: State) -> dict[str, Any]:
    n = int(state.get("count", 0)) + 1
    state.set("count", n)
    # A little work per record, so the stream is still running when the test kills the broker.
    time.sleep(0.002)
    return {"i": value["i"], "count": n}


def main() -> None:
    bootstrap, source, sink, group, state_dir = sys.argv[1:]
    app = Application(broker_address=bootstrap, consumer_group=group, state_dir=state_dir,
                      processing_guarantee="exactly-once", auto_offset_reset="earliest", commit_interval=0.5)
    inputs = app.topic(source, key_deserializer="str", value_deserializer="json")
    outputs = app.topic(sink, key_serializer="str", value_serializer="json")
    app.dataframe(inputs).apply(count, stateful=True).to_topic(outputs)
    print("running", flush=True)
    app.run()


if __name__ == "__main__":
    main()
