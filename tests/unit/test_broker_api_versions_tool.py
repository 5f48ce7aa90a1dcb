"""kafka-broker-api-versions' lines, in Kafka's format, against this client's own version ranges."""

from __future__ import annotations

from shoal.client.tools.broker_api_versions import format_versions, main
from shoal.protocol import messages


def test_lines_say_which_versions_both_sides_speak() -> None:
    produce = messages.REQUESTS[0].spec.valid
    api_versions = messages.REQUESTS[18].spec.valid
    lines = format_versions({
        18: (0, api_versions.high + 5),  # newer broker: usable up to ours
        0: (produce.low - 3, produce.low - 1),  # a broker too old for this client
        32: (2, 2),
        9999: (0, 1),  # an API this client does not know
    })
    assert lines == [
        f"Produce(0): {produce.low - 3} to {produce.low - 1} [unusable: node too old]",
        f"ApiVersions(18): 0 to {api_versions.high + 5} [usable: {api_versions.high}]",
        "DescribeConfigs(32): 2 [usable: 2]",
        "UNKNOWN(9999): 0 to 1",
    ]
    newer = format_versions({0: (produce.high + 1, produce.high + 2)})
    assert newer == [f"Produce(0): {produce.high + 1} to {produce.high + 2} [unusable: node too new]"]


def test_missing_bootstrap_server_is_a_usage_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 1
    assert 'Missing required argument "[bootstrap-server]"' in capsys.readouterr().err
