"""The allow-list of librdkafka broker tests `make compat` runs, and the counting of their results.

Pure: no processes, no files but the allow-list's text, so the unit tests can check both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ALLOWLIST = Path(__file__).with_name("allowlist.txt")

MODES = ("classic", "consumer", "noautocreate")
_NUMBER = re.compile(r"^\d{4}$")


class AllowlistError(ValueError):
    pass


@dataclass(frozen=True)
class Entry:
    kind: str  # "run", "xfail" or "exclude"
    number: str  # librdkafka's four-digit test number
    modes: tuple[str, ...]  # empty for "exclude"
    reason: str  # why an xfail fails or an exclude is not run; a note for "run"


def parse(text: str) -> list[Entry]:
    entries: list[Entry] = []
    seen: set[tuple[str, str]] = set()
    excluded: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line, _, note = raw.partition("#")
        words = line.split()
        if not words:
            continue
        kind = words[0]
        if kind not in ("run", "xfail", "exclude"):
            raise AllowlistError(f"line {lineno}: unknown kind {kind!r}")
        if len(words) < 2 or not _NUMBER.match(words[1]):
            raise AllowlistError(f"line {lineno}: a four-digit test number must follow {kind!r}")
        number = words[1]
        # A number may have a line per mode (run in one, xfail in another), but each (number, mode) once,
        # and an excluded number no other line.
        if number in excluded or (kind == "exclude" and any(n == number for n, _ in seen)):
            raise AllowlistError(f"line {lineno}: test {number} is listed twice")
        if kind == "exclude":
            excluded.add(number)
            reason = " ".join(words[2:])
            if not reason:
                raise AllowlistError(f"line {lineno}: exclude {number} needs a reason")
            entries.append(Entry(kind, number, (), reason))
            continue
        if len(words) < 3:
            raise AllowlistError(f"line {lineno}: {kind} {number} needs its modes")
        modes = tuple(words[2].split(","))
        unknown = [mode for mode in modes if mode not in MODES]
        if unknown or len(set(modes)) != len(modes):
            raise AllowlistError(f"line {lineno}: modes must be distinct names from {MODES}, not {words[2]!r}")
        if any((number, mode) in seen for mode in modes):
            raise AllowlistError(f"line {lineno}: test {number} is listed twice for a mode")
        seen.update((number, mode) for mode in modes)
        reason = " ".join(words[3:]) if kind == "xfail" else note.strip()
        if kind == "xfail" and not reason:
            raise AllowlistError(f"line {lineno}: xfail {number} needs a reason")
        entries.append(Entry(kind, number, modes, reason))
    return entries


def load(path: Path = ALLOWLIST) -> list[Entry]:
    return parse(path.read_text())


def numbers_in_source(test_c: str) -> dict[str, bool]:
    """Test numbers librdkafka's tests/test.c defines, each with whether any variant needs a broker.

    A variant flagged TEST_F_LOCAL runs on the mock cluster (or nothing) and is skipped under -L.
    """
    numbers: dict[str, bool] = {}
    for match in re.finditer(r"_TEST\((\d{4})_\w+,\s*([^,)]*)", test_c):
        number, flags = match.group(1), match.group(2)
        numbers[number] = numbers.get(number, False) or "TEST_F_LOCAL" not in flags
    return numbers


def check_against_source(entries: Iterable[Entry], numbers: Mapping[str, bool]) -> list[str]:
    """Problems of the allow-list against the pinned version's tests (numbers_in_source): a number
    it names that the version lacks or that has only local variants, and a broker test it leaves out."""
    listed = {entry.number for entry in entries}
    problems = [f"{number}: not a broker test of this librdkafka" for number in sorted(listed)
                if not numbers.get(number)]
    problems += [f"{number}: broker test not in the allow-list (run, xfail or exclude it)"
                 for number, needs_broker in sorted(numbers.items()) if needs_broker and number not in listed]
    return problems


# A test-runner state per test name, from the JSON report TEST_REPORT names.
PASSED, FAILED, SKIPPED = "PASSED", "FAILED", "SKIPPED"


def read_report(text: str) -> dict[str, str]:
    """Each test's state from a test-runner report (TEST_REPORT), "<MAIN>" left out.

    The report is JSON whose "tests" object maps a test name to {"state": ...}.
    """
    report = json.loads(text)
    tests: Mapping[str, Mapping[str, object]] = report.get("tests", {})
    return {name: str(info["state"]) for name, info in tests.items() if name != "<MAIN>"}


@dataclass(frozen=True)
class Outcome:
    """One (test number, mode) run."""
    number: str
    mode: str
    expected_to_fail: bool
    passed: bool
    detail: str  # failing variants, "timed out after Ns", "no variant ran", ...

    @property
    def label(self) -> str:
        return f"{self.number}[{self.mode}]"


def judge(number: str, mode: str, expected_to_fail: bool, states: Mapping[str, str] | None,
          timed_out: float | None = None) -> Outcome:
    """A run passes when it finished in time, and every variant of the number that ran passed with at
    least one that ran (a run where everything skipped says nothing about the broker)."""
    if timed_out is not None:
        return Outcome(number, mode, expected_to_fail, False, f"timed out after {timed_out:.0f}s")
    if states is None:
        return Outcome(number, mode, expected_to_fail, False, "no report (the test runner crashed)")
    ours = {name: state for name, state in states.items() if name.startswith(number + "_")}
    failed = sorted(name for name, state in ours.items() if state not in (PASSED, SKIPPED))
    ran = [name for name, state in ours.items() if state == PASSED]
    if failed:
        return Outcome(number, mode, expected_to_fail, False, "failed: " + ", ".join(
            f"{name} ({ours[name]})" for name in failed))
    if not ran:
        return Outcome(number, mode, expected_to_fail, False, "no variant ran (all skipped)")
    return Outcome(number, mode, expected_to_fail, True, "")


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    @property
    def passed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.passed]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.passed]

    @property
    def unexpected_failures(self) -> list[Outcome]:
        return [o for o in self.failed if not o.expected_to_fail]

    @property
    def unexpected_passes(self) -> list[Outcome]:
        return [o for o in self.passed if o.expected_to_fail]

    def lines(self) -> Iterable[str]:
        for outcome in self.failed:
            tag = "expected failure" if outcome.expected_to_fail else "FAILED"
            yield f"{tag}: {outcome.label} {outcome.detail}"
        for outcome in self.unexpected_passes:
            yield f"passed though listed as xfail: {outcome.label}"
        yield f"unexpected failures: {len(self.unexpected_failures)}"
        yield f"librdkafka: {len(self.passed)} passed, {len(self.failed)} failed"

    @property
    def exit_status(self) -> int:
        return 1 if self.unexpected_failures else 0
