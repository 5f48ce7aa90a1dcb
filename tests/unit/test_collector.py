"""The broker's garbage-collector settings, checked in a fresh interpreter (they are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

from shoal.broker.server.collector import FULL_COLLECTION_THRESHOLD

_PROBE = """
import gc, json
from shoal.broker.server.collector import settle_after_start
before = gc.get_threshold()
settle_after_start()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_settling_freezes_start_up_and_makes_full_collections_rare() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True).stdout
    got = json.loads(out)
    young, middle, full = got["before"]
    assert full < FULL_COLLECTION_THRESHOLD
    # Young collections keep the interpreter's pace; only the full ones wait longer.
    assert got["after"] == [young, middle, FULL_COLLECTION_THRESHOLD]
    # What start-up built is out of every later collection.
    assert got["frozen"] > 1000
