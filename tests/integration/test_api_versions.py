"""The versions the broker offers in ApiVersions, pinned: a newer Kafka spec in protocol/specs/ may allow
versions Shoal does not serve, and must not change what the broker offers. A deliberate change to a
handler's registered range updates api_versions_offered.json with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .external import ExternalBroker
from .kafka_wire import WireClient

OFFERED: dict[str, list[int]] = json.loads((Path(__file__).parent / "api_versions_offered.json").read_text())
EXPECTED = {key: (lo, hi) for key, lo, hi in OFFERED.values()}


def _offered(broker: BrokerProcess | ExternalBroker, version: int) -> dict[int, tuple[int, int]]:
    body = messages.ApiVersionsRequest(client_software_name="shoal-tests", client_software_version="1")
    with WireClient.connect(broker.bootstrap) as wire:
        response = wire.request(ApiKey.API_VERSIONS, version, body)
    assert response.error_code == ErrorCode.NONE
    ranges = {a.api_key: (a.min_version, a.max_version) for a in response.api_keys}
    assert len(ranges) == len(response.api_keys)  # one entry per API
    return ranges


@pytest.mark.parametrize("version", [0, 3, 4])
def test_offered_versions_are_pinned(broker: BrokerProcess, version: int) -> None:
    assert _offered(broker, version) == EXPECTED


def test_offered_versions_are_within_the_specs() -> None:
    for name, (key, lo, hi) in OFFERED.items():
        assert messages.API_NAMES[key] == name
        spec = messages.REQUESTS[key].spec
        assert lo in spec.valid and hi in spec.valid, (name, lo, hi, spec.valid)
        # Kafka offers a version its spec marks unstable only with unstable.api.versions.enable.
        assert not (spec.latest_version_unstable and hi == spec.valid.high), name


def test_kafka_python_sees_the_same_ranges(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="api-versions-test")
    try:
        seen = admin.api_versions()
    finally:
        admin.close()
    assert {int(k): (lo, hi) for k, (lo, hi) in seen.items()} == EXPECTED
