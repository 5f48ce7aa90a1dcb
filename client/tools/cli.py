"""What the command-line tools share: an argument parser that reports misuse the way Kafka's tools do
(message on stderr, exit code 1), `--version`, and the date formats Kafka's tools print and parse."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import NoReturn

from shoal.iso_duration import parse_iso_duration_ms


class UsageError(Exception):
    """The command line is wrong; the message says how."""


class ToolParser(argparse.ArgumentParser):
    """argparse, but misuse raises UsageError instead of exiting with argparse's code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=shoal_version(), help="Display Shoal's version.")


def shoal_version() -> str:
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def usage_failure(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"Error: {message}", file=sys.stderr)
    print(f"Run '{parser.prog} --help' for the options.", file=sys.stderr)
    return 1


# ---- dates and durations -----------------------------------------------------------------------------

_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?(Z|[+-]\d{2}:?\d{2})?$"
)


def parse_datetime_ms(text: str) -> int:
    """Epoch ms of `YYYY-MM-DDTHH:mm:SS.sss`, optionally with a `Z` or `+hh:mm` zone (local time without one),
    the format of Kafka's --to-datetime."""
    match = _DATETIME.match(text.strip())
    if match is None:
        raise UsageError(f"--to-datetime {text!r} is not in the format YYYY-MM-DDTHH:mm:SS.sss[Z|+hh:mm]")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    millis = int((match.group(7) or "0").ljust(3, "0"))
    zone = match.group(8)
    tz: timezone | None = None
    if zone == "Z":
        tz = UTC
    elif zone:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        moment = datetime(year, month, day, hour, minute, second, millis * 1000, tzinfo=tz)
    except ValueError as exc:
        raise UsageError(f"--to-datetime {text!r}: {exc}") from None
    if tz is None:
        moment = moment.astimezone()  # naive = the machine's local time, as Kafka's tool reads it
    return int(moment.timestamp() * 1000)


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration `PnDTnHnMnS` (Kafka's --by-duration); must not be negative."""
    try:
        millis = parse_iso_duration_ms(text)
    except ValueError:
        raise UsageError(f"--by-duration {text!r} is not an ISO-8601 duration 'PnDTnHnMnS' such as P1DT2H30M or PT15M") from None
    if millis < 0 or text.strip().startswith("-"):
        raise UsageError(f"--by-duration {text!r} must not be negative")
    return millis


_JAVA_DATE_TOKENS = {
    "yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "hh": "%I", "mm": "%M", "ss": "%S",
    "a": "%p", "EEE": "%a", "MMM": "%b", "Z": "%z", "z": "%Z",
}
_JAVA_DATE_PATTERN = re.compile(r"'[^']*'|yyyy|yy|SSS|MMM|MM|dd|HH|hh|mm|ss|EEE|a|Z|z")


def format_java_date(pattern: str, epoch_ms: int) -> str:
    """Render epoch ms with a java.text.SimpleDateFormat pattern (the letters Kafka's --date-format uses)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000).astimezone()

    def render(match: re.Match[str]) -> str:
        token = match.group(0)
        if token.startswith("'"):
            return token[1:-1] if token != "''" else "'"
        if token == "SSS":
            return f"{epoch_ms % 1000:03d}"
        return moment.strftime(_JAVA_DATE_TOKENS[token])

    return _JAVA_DATE_PATTERN.sub(render, pattern)
