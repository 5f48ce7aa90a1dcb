"""The error codes sidecar mode counts from the upstream's answers: every non-NONE code at any depth."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shoal.broker.upstream.metrics import UpstreamMetrics, error_codes
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

_Fetch = messages.FetchResponse
_Groups = messages.DescribeGroupsResponse

codes = st.sampled_from([ErrorCode.NONE, ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                         ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.FENCED_LEADER_EPOCH])


@given(top=codes, partitions=st.lists(st.lists(codes, max_size=5), max_size=4))
def test_every_error_code_of_a_fetch_answer_is_found(top: int, partitions: list[list[int]]) -> None:
    response = _Fetch(error_code=top, responses=[
        _Fetch.FetchableTopicResponse(topic=f"t{i}", partitions=[
            _Fetch.PartitionData(partition_index=j, error_code=code, records=b"\x00" * 20)
            for j, code in enumerate(topic)])
        for i, topic in enumerate(partitions)])
    expected = [c for c in [top, *(c for topic in partitions for c in topic)] if c != ErrorCode.NONE]
    assert sorted(error_codes(response)) == sorted(expected)


def test_counted_by_api_and_error_name() -> None:
    metrics = UpstreamMetrics(CollectorRegistry())
    response = _Groups(groups=[_Groups.DescribedGroup(group_id="a", error_code=ErrorCode.NOT_COORDINATOR),
                               _Groups.DescribedGroup(group_id="b", error_code=ErrorCode.NONE),
                               _Groups.DescribedGroup(group_id="c", error_code=ErrorCode.NOT_COORDINATOR)])
    metrics.observe_response("DescribeGroups", response)
    metrics.observe_response("DescribeGroups", _Groups(groups=[]))
    value = metrics.registry.get_sample_value
    assert value("shoal_upstream_response_errors_total", {"api": "DescribeGroups", "error": "NOT_COORDINATOR"}) == 2
    assert value("shoal_upstream_response_errors_total", {"api": "DescribeGroups", "error": "NONE"}) is None
