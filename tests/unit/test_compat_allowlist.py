"""`make compat`'s allow-list and its counting of librdkafka's test-runner reports (tests/compat/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.allowlist import (
    MODES,
    AllowlistError,
    Summary,
    check_against_source,
    judge,
    load,
    numbers_in_source,
    parse,
    read_report,
)

SAMPLES = Path(__file__).parents[1] / "compat" / "samples"

# Lines as librdkafka 2.15.1's tests/test.c declares its tests: one with several variants, local ones,
# flags on a line of their own, a manual one.
TEST_C_EXCERPT = """
#define _TEST(NAME, FLAGS, ...)                                                \\
struct test tests[] = {
    {.name = "<MAIN>", .flags = TEST_F_LOCAL},
    _TEST(0000_unittests,
          TEST_F_LOCAL,
          _THRES(.ucpu = 100.0, .scpu = 20.0, .rss = 900.0)),
    _TEST(0001_multiobj, 0),
    _TEST(0009_mock_cluster,
          TEST_F_LOCAL,
          TEST_BRKVER(0, 11, 0, 0)),
    _TEST(0045_subscribe_update, 0, TEST_BRKVER(0, 9, 0, 0)),
    _TEST(0045_subscribe_update_mock, TEST_F_LOCAL),
    _TEST(0066_plugins,
          TEST_F_LOCAL | TEST_F_KNOWN_ISSUE_WIN32 | TEST_F_KNOWN_ISSUE_OSX,
          .extra = "dynamic loading of tests might not be fixed for this platform"),
    _TEST(0170_share_consumer_subscription, 0, TEST_BRKVER(4, 2, 0, 0)),
    _TEST(8000_idle, TEST_F_MANUAL),
"""


def test_the_shipped_allowlist_parses_and_says_why_for_every_exclusion() -> None:
    entries = load()
    runs_by_mode = [(e.number, mode) for e in entries for mode in e.modes]
    assert len(runs_by_mode) == len(set(runs_by_mode))
    runs = [e for e in entries if e.kind != "exclude"]
    assert runs and all(e.modes and set(e.modes) <= set(MODES) for e in runs)
    assert all(e.reason for e in entries if e.kind != "run")
    # The families the issue names are all there: share consumers, transactions (0129 reads aborted ones),
    # KIP-848 groups, admin.
    listed = {e.number for e in runs}
    assert {"0170", "0185", "0129", "0081", "0001"} <= listed
    assert any("consumer" in e.modes for e in runs)


def test_numbers_in_source_tells_broker_tests_from_local_ones() -> None:
    assert numbers_in_source(TEST_C_EXCERPT) == {
        "0000": False, "0001": True, "0009": False, "0045": True, "0066": False, "0170": True, "8000": True,
    }


def test_the_allowlist_is_checked_against_the_version_s_tests() -> None:
    numbers = numbers_in_source(TEST_C_EXCERPT)
    entries = parse("run 0001 classic\nrun 0009 classic\nexclude 0170 needs three brokers\nexclude 4242 gone\n")
    assert check_against_source(entries, numbers) == [
        "0009: not a broker test of this librdkafka",
        "4242: not a broker test of this librdkafka",
        "0045: broker test not in the allow-list (run, xfail or exclude it)",
        "8000: broker test not in the allow-list (run, xfail or exclude it)",
    ]


@pytest.mark.parametrize("text, complaint", [
    ("skip 0001 classic", "unknown kind"),
    ("run 1 classic", "four-digit"),
    ("run 0001", "needs its modes"),
    ("run 0001 classic,kraft", "modes must be"),
    ("run 0001 classic,classic", "modes must be"),
    ("exclude 0001", "needs a reason"),
    ("xfail 0001 classic", "needs a reason"),
    ("run 0001 classic\nexclude 0001 twice", "listed twice"),
    ("exclude 0001 gone\nrun 0001 classic", "listed twice"),
    ("run 0001 classic,consumer\nxfail 0001 consumer flaky", "listed twice for a mode"),
])
def test_malformed_lines_are_refused_with_their_line(text: str, complaint: str) -> None:
    with pytest.raises(AllowlistError, match=complaint):
        parse(text)


def test_a_number_may_run_in_one_mode_and_be_expected_to_fail_in_another() -> None:
    [run, xfail] = parse("run 0045 classic\nxfail 0045 consumer regex resolved at once\n")
    assert (run.kind, run.modes, xfail.kind, xfail.modes) == ("run", ("classic",), "xfail", ("consumer",))


def test_comments_notes_and_modes_are_read() -> None:
    [run, xfail, exclude] = parse(
        "# header\n\nrun 0102 classic,consumer   # static members\n"
        "xfail 0011 classic record errors missing  # note\nexclude 0101 three brokers in racks\n")
    assert (run.kind, run.number, run.modes, run.reason) == ("run", "0102", ("classic", "consumer"), "static members")
    assert (xfail.modes, xfail.reason) == (("classic",), "record errors missing")
    assert (exclude.modes, exclude.reason) == ((), "three brokers in racks")


def captured(name: str) -> dict[str, str]:
    return read_report((SAMPLES / name).read_text())


def test_reports_captured_from_the_test_runner_are_judged() -> None:
    passed = judge("0170", "classic", False, captured("report-0170-passed.json"))
    assert passed.passed and passed.label == "0170[classic]"
    failed = judge("0011", "classic", False, captured("report-0011-failed.json"))
    assert not failed.passed and failed.detail == "failed: 0011_produce_batch (FAILED)"
    # Skipped everywhere (0053 without RapidJSON) says nothing about the broker: not a pass.
    skipped = judge("0053", "classic", False, captured("report-0053-skipped.json"))
    assert not skipped.passed and "all skipped" in skipped.detail
    # Other numbers' entries in the report (the runner lists every test) do not count.
    assert "<MAIN>" not in captured("report-0011-failed.json")
    assert not judge("0017", "classic", False, captured("report-0170-passed.json")).passed


def test_a_variant_that_failed_fails_the_run_even_if_another_passed() -> None:
    states = {"0045_subscribe_update": "PASSED", "0045_subscribe_many_updates": "FAILED",
              "0045_subscribe_update_mock": "SKIPPED"}
    outcome = judge("0045", "consumer", False, states)
    assert not outcome.passed and outcome.detail == "failed: 0045_subscribe_many_updates (FAILED)"
    assert "timed out after 600s" == judge("0045", "classic", False, None, timed_out=600).detail
    assert "crashed" in judge("0045", "classic", False, None).detail


def test_the_summary_counts_and_exits_non_zero_only_on_unexpected_failures() -> None:
    summary = Summary()
    summary.add(judge("0001", "classic", False, {"0001_multiobj": "PASSED"}))
    summary.add(judge("0011", "classic", True, captured("report-0011-failed.json")))
    assert summary.exit_status == 0
    summary.add(judge("0102", "consumer", True, {"0102_static_group_rebalance": "PASSED"}))
    assert summary.exit_status == 0
    lines = list(summary.lines())
    assert "passed though listed as xfail: 0102[consumer]" in lines
    assert lines[-1] == "librdkafka: 2 passed, 1 failed"
    summary.add(judge("0170", "classic", False, None, timed_out=600))
    assert summary.exit_status == 1
    assert "FAILED: 0170[classic] timed out after 600s" in list(summary.lines())
    assert list(summary.lines())[-2:] == ["unexpected failures: 1", "librdkafka: 2 passed, 2 failed"]
