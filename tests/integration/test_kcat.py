"""kcat (librdkafka's command-line client) against the real broker: -L, -P, -C and -G group topic.

kcat is a Debian package: the test installs it when it is missing and apt-get can, and skips with a
message where it cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from .broker_process import BrokerProcess


@pytest.fixture(scope="module")
def kcat() -> str:
    found = shutil.which("kcat")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "kcat"], capture_output=True, timeout=300, check=False)
        found = shutil.which("kcat")
    if found is None:
        pytest.skip("kcat is not installed and could not be installed with apt-get (needs root and the package)")
    return found


def test_kcat_metadata_produce_consume_and_group(kcat: str, broker: BrokerProcess) -> None:
    topic, group = f"kcat-{uuid.uuid4().hex[:6]}", f"kcat-{uuid.uuid4().hex[:6]}"

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([kcat, "-b", broker.bootstrap, *args], input=stdin, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return done

    run("-P", "-t", topic, stdin="a\nb\nc\n")
    assert f'topic "{topic}" with 1 partitions' in run("-L", "-t", topic).stdout
    assert run("-C", "-t", topic, "-o", "beginning", "-e").stdout.split() == ["a", "b", "c"]
    # A classic consumer group: the first member reads everything and commits when it leaves ...
    first = run("-G", group, topic, "-X", "auto.offset.reset=earliest", "-e")
    assert first.stdout.split() == ["a", "b", "c"] and "assigned" in first.stderr
    # ... so the next one resumes after what was committed.
    run("-P", "-t", topic, stdin="d\n")
    assert run("-G", group, topic, "-X", "auto.offset.reset=earliest", "-e").stdout.split() == ["d"]
