"""The `discovery` section: defaults, environment overrides and clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config.checks import ConfigError
from sidecar.config.loading import config_from_mapping
from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM


def base(**extra: Any) -> dict[str, Any]:
    return {
        "region": "west",
        "regions": ["west", "east"],
        "nats": {"servers": ["nats://127.0.0.1:4222"]},
        **extra,
    }


def problems(data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, env)
    return info.value.problems


def test_off_by_default_with_the_listed_streams_defaults() -> None:
    config = config_from_mapping(base(streams=[{"name": "orders"}]))
    discovery = config.discovery
    assert not discovery.enabled
    assert discovery.match == ("*",)
    assert discovery.interval_s == 30.0
    assert (discovery.write_stream, discovery.read_stream) == (
        DEFAULT_WRITE_STREAM,
        DEFAULT_READ_STREAM,
    )


def test_discovery_alone_needs_no_listed_stream() -> None:
    config = config_from_mapping(base(discovery={"enabled": True, "match": ["orders-*"]}))
    assert config.streams == ()
    assert config.discovery.matches("orders-eu")
    assert not config.discovery.matches("billing")


def test_listed_and_discovered_streams_together() -> None:
    config = config_from_mapping(
        base(streams=[{"name": "orders", "replicas": 3}], discovery={"enabled": True})
    )
    assert [s.name for s in config.streams] == ["orders"]
    assert config.discovery.enabled


def test_without_streams_and_without_discovery_the_error_says_both_ways() -> None:
    expected = ["streams: must list at least one stream, or turn discovery on"]
    assert problems(base()) == expected
    assert problems(base(streams=[])) == expected
    assert problems(base(discovery={"enabled": False})) == expected


def test_environment_overrides() -> None:
    env = {
        "RSUB_DISCOVERY__ENABLED": "true",
        "RSUB_DISCOVERY__MATCH": "orders-*, billing",
        "RSUB_DISCOVERY__INTERVAL_S": "5",
        "RSUB_DISCOVERY__READ_STREAM": "{name}_at_{region}",
    }
    discovery = config_from_mapping(base(), env).discovery
    assert discovery.enabled
    assert discovery.match == ("orders-*", "billing")
    assert discovery.interval_s == 5.0
    assert discovery.read_stream == "{name}_at_{region}"


@pytest.mark.parametrize(
    ("discovery", "env", "expected"),
    [
        (
            {"match": []},
            {},
            "discovery.match: must list at least one glob",
        ),
        (
            {"match": ["orders.*"]},
            {},
            "discovery.match: invalid glob(s) ['orders.*']: a virtual-stream name holds "
            "letters, digits, '_' and '-'; the wildcards are *, ? and [...]",
        ),
        ({"match": "orders-*"}, {}, "discovery.match: expected a list, got str 'orders-*'"),
        ({"interval_s": 0}, {}, "discovery.interval_s: must be positive, got 0.0"),
        (
            {},
            {"RSUB_DISCOVERY__INTERVAL_S": "soon"},
            "discovery.interval_s: expected a number, got 'soon' (from RSUB_DISCOVERY__INTERVAL_S)",
        ),
        (
            {},
            {"RSUB_DISCOVERY__ENABLE": "true"},
            "RSUB_DISCOVERY__ENABLE: unknown setting: no key 'discovery.enable' "
            "(did you mean RSUB_DISCOVERY__ENABLED?)",
        ),
        (
            {"read_stream": "{name}-read"},
            {},
            "discovery.read_stream: '{name}-read' must contain {name} and {region}",
        ),
        (
            {"write_stream": "{name}-read-{region}"},
            {},
            "discovery.read_stream: write and read stream names collide "
            "('{name}-read-{region}' vs '{name}-read-{region}')",
        ),
        ({"enabled": "yes"}, {}, "discovery.enabled: expected a boolean, got str 'yes'"),
        ({"matches": ["x"]}, {}, "discovery.matches: unknown key (did you mean 'match'?)"),
    ],
)
def test_errors_name_the_key(discovery: dict[str, Any], env: dict[str, str], expected: str) -> None:
    data = base(discovery={"enabled": True, **discovery})
    assert problems(data, env) == [expected]
