"""Stream discovery without servers: which stream names make a virtual stream to run, the
inversion of the read-stream pattern, and the series a dropped stream leaves behind."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.metrics import SidecarMetrics
from sidecar.naming import name_in_stream, region_in_stream
from sidecar.runtime.discovery import found_streams


def config(discovery: dict[str, Any], streams: list[dict[str, Any]] | None = None) -> Config:
    return config_from_mapping(
        {
            "region": "west",
            "regions": ["west", "east"],
            "nats": {"servers": ["nats://127.0.0.1:4222"]},
            "streams": streams or [],
            "discovery": {"enabled": True, **discovery},
        }
    )


# What an account holds: two rsub virtual streams laid out in full, one whose write stream in
# west is missing, the region's KV bucket, and streams of the application's own.
ACCOUNT = [
    "orders-write-west",
    "orders-write-east",
    "orders-read-west",
    "orders-read-east",
    "orders-eu-write-east",
    "orders-eu-read-west",
    "orders-eu-read-east",
    "billing-write-west",
    "billing-read-west",
    "KV_rsub-leases-west",
    "audit",
    "read-west",
]


@pytest.mark.parametrize(
    ("pattern", "region", "stream", "name"),
    [
        ("{name}-read-{region}", "west", "orders-read-west", "orders"),
        ("{name}-read-{region}", "west", "orders-read-east", None),
        ("{name}-read-{region}", "west", "orders-read-west-read-west", "orders-read-west"),
        ("{name}-read-{region}", "west", "-read-west", None),
        ("{name}-read-{region}", "west", "_x-read-west", None),
        ("{name}_at_{region}", "east", "orders_at_east", "orders"),
        ("{region}.{name}", "west", "west.orders", "orders"),
        ("{name}-{region}-{name}", "west", "a-west-a", "a"),
        ("{name}-{region}-{name}", "west", "a-west-b", None),
    ],
)
def test_the_read_pattern_is_inverted_for_this_region(
    pattern: str, region: str, stream: str, name: str | None
) -> None:
    assert name_in_stream(pattern, region, stream) == name


def test_both_inversions_agree_with_the_pattern() -> None:
    pattern = "{name}_at_{region}"
    stream = pattern.format(name="orders", region="west")
    assert name_in_stream(pattern, "west", stream) == "orders"
    assert region_in_stream(pattern, "orders", stream) == "west"


def test_a_stream_is_taken_up_when_its_read_and_write_streams_here_exist() -> None:
    found = found_streams(ACCOUNT, config({}))
    assert sorted(found.streams) == ["billing", "orders"]
    assert found.streams["orders"].read_stream("west") == "orders-read-west"
    # Its write stream in west is missing: left aside, and the reason names it.
    assert found.skipped == {"orders-eu": "its write stream 'orders-eu-write-west' does not exist"}


def test_only_names_matching_a_glob_are_taken_up() -> None:
    account = [*ACCOUNT, "orders-eu-write-west"]
    assert sorted(found_streams(account, config({"match": ["orders*"]})).streams) == [
        "orders",
        "orders-eu",
    ]
    assert sorted(found_streams(account, config({"match": ["orders"]})).streams) == ["orders"]
    assert sorted(found_streams(account, config({"match": ["b?ll*", "nope"]})).streams) == [
        "billing"
    ]
    # Globs are case-sensitive, as stream names are.
    assert found_streams(account, config({"match": ["ORDERS"]})).streams == {}


def test_a_listed_stream_is_left_to_its_own_settings() -> None:
    listed = [{"name": "orders", "read_stream": "{name}-read-{region}", "replicas": 3}]
    found = found_streams(ACCOUNT, config({}, streams=listed))
    assert sorted(found.streams) == ["billing"]


def test_discovered_streams_use_the_discovery_patterns() -> None:
    account = ["in_west_orders", "orders_at_west", "orders_at_east", "orders-read-west"]
    patterns = {"write_stream": "in_{region}_{name}", "read_stream": "{name}_at_{region}"}
    found = found_streams(account, config(patterns))
    assert list(found.streams) == ["orders"]
    vs = found.streams["orders"]
    assert (vs.write_stream("east"), vs.read_stream("east")) == ("in_east_orders", "orders_at_east")


def test_a_dropped_stream_leaves_no_gauge_behind() -> None:
    metrics = SidecarMetrics(clock=lambda: 100.0)
    for stream in ("gone", "kept"):
        metrics.set_leader(stream, True, 7)
        metrics.set_origin_index_bytes(stream, 48)
        metrics.set_replay_gap(stream, "app", "east", 3)
        metrics.set_failover_exposure(stream, "app", 2)
        metrics.snapshot_completed(stream, 0.1)
        metrics.marker_seen(stream, "east")
    metrics.stream_dropped("gone")
    text = generate_latest(metrics.registry).decode()
    gauges = [
        line
        for line in text.splitlines()
        if not line.startswith("#") and "_total" not in line and "duration" not in line
    ]
    assert [line for line in gauges if '"gone"' in line] == []
    assert len([line for line in gauges if '"kept"' in line]) == 7
    assert "rsub_streams_dropped_total 1.0" in text
