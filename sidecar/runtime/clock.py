"""The runtime's wall clock: the machine has none, every timestamp reaches it from here."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
