"""The sidecar stack (docker/docker-compose.sidecar.yml: Apache Kafka 3.9, or a standalone Shoal upstream where
that image cannot be had, two sidecars and the example Spark job) with the real images and containers:
`make compose-test` runs this module (it needs a Docker engine, so the plain suite skips it).

- the `tests` service runs the sidecar tests inside the compose network, against the sidecars;
- the Spark job prices orders through the sidecars into `orders-priced`, which the upstream holds; one
  sidecar is killed with SIGKILL under the running job, which goes on through the survivor without a
  restart of its own, and again once the killed sidecar is back.

One stack serves both, in turn: the `tests` service runs first, then the Spark job is started. Run at once,
the Spark JVM's start-up on a two-core machine starved the `tests` service's share consumers past their
deadlines.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from .orders_job import (
    COMPOSE_MARKS,
    JOB_PARTITIONS,
    JOB_TOPICS,
    WAIT_S,
    load_job,
    priced,
    produce_orders,
    start_checking,
    wait_priced,
)
from .stack import Stack, docker, sidecar_stack

pytestmark = COMPOSE_MARKS

SIDECARS = ("shoal-1", "shoal-2")

# Run inside a sidecar's container (the broker image has Shoal's client): every record value of a topic,
# read by offset straight from the upstream, one a line.
READ_UPSTREAM = """
import sys
from shoal.client.consumer.offset_reader import OffsetReader
from shoal.protocol.records import decode_records
bootstrap, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
with OffsetReader(bootstrap) as reader:
    for p in range(partitions):
        start, end = reader.log_start_offset(topic, p), reader.log_end_offset(topic, p)
        for _, step in reader.read_ranges(topic, p, [(start, end - 1)] if end > start else []):
            for header, at in step.batches:
                for r in decode_records(step.data, at, header):
                    if r.offset >= step.first and r.value is not None:
                        print(r.value.decode())
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = sidecar_stack(os.environ.get("SHOAL_SIDECAR_COMPOSE_PROJECT", f"shoal-sidecar-{uuid.uuid4().hex[:8]}"))
    try:
        # `up` starts the upstream first: the sidecars wait for its healthchecks. The job is built now and
        # started by its test.
        s.compose("build", "spark-orders-job")
        s.compose("up", "-d", "--build", *SIDECARS)
        for sidecar in SIDECARS:
            s.wait_healthy(sidecar)
        yield s
    finally:
        s.down()


def bootstrap(stack: Stack, sidecar: str) -> str:
    """A sidecar's PLAINTEXT listener, through its port published on 127.0.0.1 (advertised as localhost)."""
    return f"localhost:{stack.env[f'SHOAL_{sidecar[-1]}_PORT']}"


def upstream_of(stack: Stack, sidecar: str) -> str:
    """The upstream.bootstrap.servers the sidecar's container was started with."""
    args = stack.inspect(sidecar)["Config"]["Cmd"]
    return next(a.split("=", 1)[1] for a in args if a.startswith("upstream.bootstrap.servers="))


def read_upstream(stack: Stack, via: str, topic: str) -> list[str]:
    container = stack.container(via)
    return docker("exec", container, "python", "-c", READ_UPSTREAM, upstream_of(stack, via), topic,
                  str(JOB_PARTITIONS), timeout=120).splitlines()


def test_sidecar_tests_service_passes_inside_the_stack(stack: Stack) -> None:
    run = stack.compose("--profile", "test", "run", "--rm", "-T", "tests", timeout=WAIT_S, check=False)
    summary = (run.stdout.strip().splitlines() or [""])[-1]
    print(f"tests service: exit code {run.returncode}: {summary}")
    assert run.returncode == 0, f"{run.stdout[-6000:]}{run.stderr[-3000:]}"


def test_spark_job_prices_orders_through_the_sidecars_across_a_sidecar_kill(stack: Stack) -> None:
    job = load_job()
    stack.compose("up", "-d", "spark-orders-job")
    first_sidecar, survivor = (bootstrap(stack, s) for s in SIDECARS)
    check_group = f"orders-check-{uuid.uuid4().hex[:8]}"
    start_checking(job, first_sidecar, check_group)
    seen: set[str] = set()
    # In through one sidecar, out through the other: the two serve one cluster.
    first = [f"widget,{i}" for i in range(1, 16)]
    produce_orders(first_sidecar, first)
    wait_priced(survivor, check_group, {priced(job, o) for o in first}, seen)
    job_before = stack.state("spark-orders-job")
    assert job_before[3], stack.logs("spark-orders-job")[-3000:]

    # SIGKILL: no leave, so the sidecar group on the upstream notices it only when its session runs out and
    # then gives every share partition and state partition to the survivor.
    killed = stack.state(SIDECARS[0])[0]
    docker("kill", "--signal", "KILL", killed)
    second = [f"gadget,{i}" for i in range(1, 16)]
    produce_orders(survivor, second)
    wait_priced(survivor, check_group, {priced(job, o) for o in second}, seen)

    # Back again: the group splits the work between the two once more, under the same running job.
    docker("start", killed)
    stack.wait_healthy(SIDECARS[0])
    third = [f"gizmo,{i}" for i in range(1, 16)]
    produce_orders(first_sidecar, third)
    wait_priced(first_sidecar, check_group, {priced(job, o) for o in third}, seen)

    # The same job container, never restarted: it rode out the sidecar's death on its own.
    job_after = stack.state("spark-orders-job")
    assert job_after == job_before, f"{job_before} -> {job_after}:\n{stack.logs('spark-orders-job')[-8000:]}"
    # The records live in the upstream: every priced order is there, read without a sidecar in the way.
    stored = set(read_upstream(stack, SIDECARS[1], JOB_TOPICS[1]))
    expected = {priced(job, o) for o in first + second + third}
    assert expected <= stored, f"not in the upstream: {sorted(expected - stored)}"
