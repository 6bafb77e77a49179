"""What the positions read takes from `STREAM.INFO` for the failback guard (pure: the JSON as
nats-server 2.15 answers it)."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.nats.consumers import created_ms, leader_since_ms, sources_heard


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"cluster": {"leader_since": "2026-11-27T07:10:00.123456789Z"}}, 1_795_763_400_123),
        ({"cluster": {"leader_since": "2026-11-27T07:10:00Z"}}, 1_795_763_400_000),
        ({"cluster": {"leader": "n1"}}, None),  # a server that does not say
        ({}, None),
        ({"cluster": {"leader_since": "yesterday"}}, None),
    ],
)
def test_leader_since(info: dict[str, Any], expected: int | None) -> None:
    assert leader_since_ms(info) == expected


def test_sources_heard_in_ms_and_never_as_none() -> None:
    info = {
        "sources": [
            {"name": "orders-west", "active": 2_500_000_000, "lag": 0},
            {"name": "orders-east", "active": -1, "lag": 12},
        ]
    }
    assert sources_heard(info) == {"orders-west": 2_500, "orders-east": None}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"created": "2026-11-27T15:49:30.018485721Z"}, 1_795_794_570_018),
        ({"created": "0001-01-01T00:00:00Z"}, -62_135_596_800_000),  # the zero time
        ({}, None),
        ({"created": 17}, None),
    ],
)
def test_created(info: dict[str, Any], expected: int | None) -> None:
    assert created_ms(info) == expected
