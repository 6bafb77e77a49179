"""A message as a stream stores it (what consumers deliver and links carry)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoredMessage:
    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]
    time_ms: int
