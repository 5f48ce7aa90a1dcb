"""ISO-8601 durations as Java's Duration.parse reads them (PnDTnHnMn.nS), e.g. for
`share.auto.offset.reset=by_duration:P1DT2H` and the tools' `--by-duration`."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^([-+])?P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$", re.IGNORECASE)


def parse_iso_duration_ms(text: str) -> int:
    """Milliseconds of the duration (negative when written with a leading '-'); ValueError if malformed."""
    stripped = text.strip()
    match = _DURATION.match(stripped)
    # "P" and "PT" alone match the pattern but name no amount, which Java rejects too.
    if match is None or stripped.upper().lstrip("+-") in ("P", "PT"):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    sign, days, hours, minutes, seconds = match.groups()
    total = int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)
    millis = int(total * 1000)
    return -millis if sign == "-" else millis
