"""Java properties text and ISO-8601 durations, shared by the broker config and the tools."""

from __future__ import annotations

import pytest

from shoal.iso_duration import parse_iso_duration_ms
from shoal.java_properties import parse_properties


def test_properties_forms_comments_and_continuations() -> None:
    text = "# comment\n! also a comment\na=1\nb: two\nc three\nd=x\\\n  y\ne=tab\\there\nf\\=g=h\n\n"
    assert parse_properties(text) == {"a": "1", "b": "two", "c": "three", "d": "xy", "e": "tab\there", "f=g": "h"}


def test_properties_key_without_value() -> None:
    assert parse_properties("lonely\n") == {"lonely": ""}


@pytest.mark.parametrize(
    ("text", "millis"),
    [("PT15M", 900_000), ("P1DT2H30M", 95_400_000), ("PT0.5S", 500), ("p1d", 86_400_000), ("-PT1S", -1000)],
)
def test_iso_durations(text: str, millis: int) -> None:
    assert parse_iso_duration_ms(text) == millis


@pytest.mark.parametrize("text", ["P", "PT", "1H", "PT1X", ""])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso_duration_ms(text)
