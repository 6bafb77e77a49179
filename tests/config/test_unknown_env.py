"""`RSUB_` variables that set no key: service links ignored, typos refused, the rest listed.

The rule is in docs/configuration.md ("Variables that set nothing").
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config.checks import ConfigError
from sidecar.config.environment import unrelated_env
from sidecar.config.loading import config_from_mapping


def minimal() -> dict[str, Any]:
    return {
        "region": "west",
        "regions": ["west", "east"],
        "nats": {"servers": ["nats://127.0.0.1:4222"]},
        "streams": [{"name": "orders"}],
    }


# What the kubelet gives every pod of the namespace for a Service with ports grpc/7070 and
# http/8080 (TCP): written out, not generated, so a wrong guess of the shape cannot hide.
SERVICE_RSUB = {
    "RSUB_SERVICE_HOST": "10.0.0.7",
    "RSUB_SERVICE_PORT": "7070",
    "RSUB_SERVICE_PORT_GRPC": "7070",
    "RSUB_SERVICE_PORT_HTTP": "8080",
    "RSUB_PORT": "tcp://10.0.0.7:7070",
    "RSUB_PORT_7070_TCP": "tcp://10.0.0.7:7070",
    "RSUB_PORT_7070_TCP_PROTO": "tcp",
    "RSUB_PORT_7070_TCP_PORT": "7070",
    "RSUB_PORT_7070_TCP_ADDR": "10.0.0.7",
    "RSUB_PORT_8080_TCP": "tcp://10.0.0.7:8080",
    "RSUB_PORT_8080_TCP_PROTO": "tcp",
    "RSUB_PORT_8080_TCP_PORT": "8080",
    "RSUB_PORT_8080_TCP_ADDR": "10.0.0.7",
}
SERVICE_RELEASE = {  # the chart's Service of a release named rsub-west
    "RSUB_WEST_RSUB_SIDECAR_SERVICE_HOST": "10.0.0.5",
    "RSUB_WEST_RSUB_SIDECAR_SERVICE_PORT": "7070",
    "RSUB_WEST_RSUB_SIDECAR_SERVICE_PORT_GRPC": "7070",
    "RSUB_WEST_RSUB_SIDECAR_SERVICE_PORT_HTTP": "8080",
    "RSUB_WEST_RSUB_SIDECAR_PORT": "tcp://10.0.0.5:7070",
    "RSUB_WEST_RSUB_SIDECAR_PORT_7070_TCP": "tcp://10.0.0.5:7070",
    "RSUB_WEST_RSUB_SIDECAR_PORT_7070_TCP_PROTO": "tcp",
    "RSUB_WEST_RSUB_SIDECAR_PORT_7070_TCP_PORT": "7070",
    "RSUB_WEST_RSUB_SIDECAR_PORT_7070_TCP_ADDR": "10.0.0.5",
    "RSUB_WEST_RSUB_SIDECAR_PORT_8080_TCP": "tcp://10.0.0.5:8080",
    "RSUB_WEST_RSUB_SIDECAR_PORT_8080_TCP_PROTO": "tcp",
    "RSUB_WEST_RSUB_SIDECAR_PORT_8080_TCP_PORT": "8080",
    "RSUB_WEST_RSUB_SIDECAR_PORT_8080_TCP_ADDR": "10.0.0.5",
}
# Services named after a section (rsub-nats, rsub-grpc), a UDP port and a named SCTP port:
# shapes that would otherwise look like a setting nested with one `_`.
SERVICE_SECTIONS = {
    "RSUB_NATS_SERVICE_HOST": "10.0.0.9",
    "RSUB_NATS_SERVICE_PORT_CLIENT": "4222",
    "RSUB_NATS_PORT_4222_TCP_ADDR": "10.0.0.9",
    "RSUB_GRPC_PORT": "tcp://10.0.0.8:7070",
    "RSUB_GRPC_PORT_53_UDP_PROTO": "udp",
    "RSUB_GRPC_SERVICE_PORT_METRICS_V2": "9090",
    "RSUB_GRPC_PORT_9999_SCTP": "sctp://10.0.0.8:9999",
}


@pytest.mark.parametrize("links", [SERVICE_RSUB, SERVICE_RELEASE, SERVICE_SECTIONS])
def test_service_links_are_ignored_silently(links: dict[str, str]) -> None:
    env = {**links, "RSUB_REGION": "east"}
    config = config_from_mapping(minimal(), env)
    assert config == config_from_mapping(minimal(), {"RSUB_REGION": "east"})
    assert unrelated_env(env) == []


def test_a_setting_wins_over_the_service_link_shape() -> None:
    # Settings have `__` before their last word, so no Service can produce one; still, a
    # variable that names a key always sets it.
    config = config_from_mapping(minimal(), {"RSUB_GRPC__LISTEN": "0.0.0.0:7070"})
    assert config.grpc.listen == "0.0.0.0:7070"


@pytest.mark.parametrize(
    ("var", "meant"),
    [
        ("RSUB_REGOIN", "RSUB_REGION"),
        ("RSUB__REGION", "RSUB_REGION"),
        ("RSUB_NATS_SERVERS", "RSUB_NATS__SERVERS"),
        ("RSUB_NATS_SERVER", "RSUB_NATS__SERVERS"),
        ("RSUB_SNAPSHOT_INTERVAL_MS", "RSUB_SNAPSHOT__INTERVAL_MS"),
        ("RSUB_SNAPSHOT__INTERVAL", "RSUB_SNAPSHOT__INTERVAL_MS"),
        ("RSUB_LEASE_TTL", "RSUB_LEASE__TTL_S"),
        ("RSUB_NATS__PASWORD", "RSUB_NATS__PASSWORD"),
        ("RSUB_GRPC__TOKEN", "RSUB_GRPC__AUTH_TOKEN"),
        ("RSUB_GRPC_TLS_CERT_FILE", "RSUB_GRPC__TLS__CERT_FILE"),
    ],
)
def test_a_likely_typo_is_refused_with_its_did_you_mean(var: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(minimal(), {var: "hunter2-value", **SERVICE_RSUB})
    (problem,) = info.value.problems
    assert problem.startswith(f"{var}: unknown setting: no key ")
    assert problem.endswith(f"(did you mean {meant}?)")
    assert "hunter2" not in str(info.value)


def test_a_variable_under_a_real_section_is_refused_even_without_a_close_key() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(minimal(), {"RSUB_HTTP__PORT": "8080"})
    assert info.value.problems == ["RSUB_HTTP__PORT: unknown setting: no key 'http.port'"]


def test_an_unrelated_variable_is_listed_by_name_and_ignored() -> None:
    env = {
        "RSUB_VERSION": "1.4.2",
        "RSUB_COLOUR": "blue",
        "RSUB_TEAM_API_KEY": "hunter2-key",
        "RSUB_REGION": "east",
        "HOME": "/root",
        **SERVICE_RELEASE,
    }
    config = config_from_mapping(minimal(), env)
    assert config.region == "east"
    names = unrelated_env(env)
    assert names == ["RSUB_COLOUR", "RSUB_TEAM_API_KEY", "RSUB_VERSION"]
    assert "hunter2" not in repr(names)


def test_typos_are_listed_with_the_other_problems() -> None:
    data = minimal()
    data["region"] = "north"
    env = {"RSUB_LEASE_BUCKET": "b", "RSUB_LOG__LEVL": "debug", "RSUB_VERSION": "1", **SERVICE_RSUB}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, env)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "RSUB_LEASE_BUCKET",
        "RSUB_LOG__LEVL",
        "region",
    ]
