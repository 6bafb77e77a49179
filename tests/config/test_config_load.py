"""Configuration loading: defaults, every kind of error naming its key, env overrides, secrets."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import structlog

from sidecar.config.checks import ConfigError
from sidecar.config.loading import config_from_mapping, load_config
from sidecar.config.schema import split_host_port
from sidecar.config.secrets import Secret, hide_userinfo
from sidecar.logs import configure_logging
from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM


def minimal() -> dict[str, Any]:
    return {
        "region": "west",
        "regions": ["west", "central", "east"],
        "nats": {"servers": ["nats://127.0.0.1:4222"]},
        "streams": [{"name": "orders"}],
    }


def problems_of(data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, env)
    assert str(info.value).count("\n") == len(info.value.problems)
    return info.value.problems


def test_defaults() -> None:
    config = config_from_mapping(minimal())
    assert config.region == "west"
    assert config.regions == ("west", "central", "east")
    assert config.nats.servers == ("nats://127.0.0.1:4222",)
    assert config.nats.user is None and config.nats.token is None
    assert config.nats.connect_timeout_s == 5.0
    assert not config.nats.tls.enabled
    stream = config.streams[0]
    assert (stream.write_stream, stream.read_stream) == (DEFAULT_WRITE_STREAM, DEFAULT_READ_STREAM)
    assert stream.replicas == 1
    assert config.cluster_for("east") == "east"
    assert (config.snapshot.interval_ms, config.snapshot.timeout_s) == (1000, 30.0)
    assert config.snapshot.cache_size == 30
    assert config.snapshot.sweep_intervals == 120
    assert config.progress.enabled
    assert (config.lease.bucket, config.lease.ttl_s) == ("rsub-leases", 10.0)
    assert config.grpc.listen == "127.0.0.1:7070" and config.grpc.auth_token is None
    assert not config.grpc.tls.enabled
    assert config.http.listen == "127.0.0.1:8080"
    assert (config.log.format, config.log.level) == ("auto", "info")


def test_null_means_default_and_config_is_frozen() -> None:
    data = minimal()
    data["streams"] = [{"name": "orders", "write_stream": None, "replicas": None}]
    data["snapshot"] = {"interval_ms": None}
    config = config_from_mapping(data)
    assert config.streams[0].write_stream == DEFAULT_WRITE_STREAM
    assert config.streams[0].replicas == 1
    assert config.snapshot.interval_ms == 1000
    with pytest.raises(AttributeError):
        config.region = "east"  # type: ignore[misc]


def test_virtual_streams_follow_patterns_and_clusters() -> None:
    data = minimal()
    data["streams"] = [
        {"name": "orders"},
        {"name": "pay", "write_stream": "w-{region}-{name}", "read_stream": "r-{region}-{name}"},
    ]
    data["cluster_for_region"] = {"east": "nats-east-1"}
    config = config_from_mapping(data)
    assert config.virtual_stream("orders").read_stream("central") == "orders-read-central"
    assert config.virtual_stream("pay").write_stream("west") == "w-west-pay"
    assert [v.name for v in config.virtual_streams] == ["orders", "pay"]
    assert config.cluster_for("east") == "nats-east-1"
    assert config.cluster_for("west") == "west"
    with pytest.raises(KeyError, match="unknown stream 'nope'"):
        config.stream("nope")


def test_an_unknown_stream_among_thousands_names_a_few() -> None:
    data = minimal()
    data["streams"] = [{"name": f"s{i}"} for i in range(3_000)]
    config = config_from_mapping(data)
    assert config.stream("s2999").name == "s2999"
    with pytest.raises(KeyError, match=r"configured: \['s0', .*'s19'\] and 2980 more"):
        config.stream("nope")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.pop("region"), "region: missing required key"),
        (lambda d: d.pop("nats"), "nats: missing required key"),
        (lambda d: d["nats"].pop("servers"), "nats.servers: missing required key"),
        (lambda d: d.update(region=None), "region: must not be null"),
        (lambda d: d.update(colour="blue"), "colour: unknown key"),
        (lambda d: d["nats"].update(pasword="x"), "nats.pasword: unknown key (did you mean"),
        (lambda d: d.update(region=7), "region: expected a string, got int"),
        (lambda d: d.update(regions="west"), "regions: expected a list, got str"),
        (lambda d: d.update(region="north"), "region: 'north' is not in regions"),
        (lambda d: d.update(regions=[]), "regions: must list at least one region"),
        (lambda d: d.update(regions=["west", "a b"]), "regions: 'a b' is not a valid name"),
        (lambda d: d.update(regions=["west", "west"]), "regions: region 'west' is listed twice"),
        (lambda d: d["nats"].update(servers=[]), "nats.servers: must list at least one server"),
        (lambda d: d["nats"].update(servers=["http://x:1"]), "nats.servers: invalid server URL"),
        (lambda d: d["nats"].update(servers=[4222]), "nats.servers[0]: expected a string"),
        (
            lambda d: d["nats"].update(connect_timeout_s=0),
            "nats.connect_timeout_s: must be positive",
        ),
        (
            lambda d: d["nats"].update(connect_timeout_s=True),
            "nats.connect_timeout_s: expected a number",
        ),
        (lambda d: d.update(streams=[]), "streams: must list at least one stream"),
        (
            lambda d: d["streams"].append({"name": "orders"}),
            "streams: duplicate stream name(s) ['orders']",
        ),
        (lambda d: d["streams"][0].update(name="_x"), "streams[0].name: '_x' is not a valid name"),
        (
            lambda d: d["streams"][0].update(name="a.b"),
            "streams[0].name: 'a.b' is not a valid name",
        ),
        (lambda d: d["streams"][0].pop("name"), "streams[0].name: missing required key"),
        (
            lambda d: d["streams"][0].update(write_stream="w-{name}"),
            "streams[0].write_stream: 'w-{name}' must contain",
        ),
        (
            lambda d: d["streams"][0].update(read_stream="{name}-write-{region}"),
            "streams[0].read_stream: write and read stream names collide",
        ),
        (
            lambda d: d["streams"][0].update(replicas=6),
            "streams[0].replicas: must be between 1 and 5",
        ),
        (
            lambda d: d.update(cluster_for_region={"mars": "c1"}),
            "cluster_for_region.mars: unknown region 'mars'",
        ),
        (
            lambda d: d.update(cluster_for_region={"west": "a b"}),
            "cluster_for_region: invalid cluster name(s) ['a b']",
        ),
        (
            lambda d: d.update(snapshot={"interval_ms": 0}),
            "snapshot.interval_ms: must be positive, got 0",
        ),
        (
            lambda d: d.update(snapshot={"interval_ms": 1.5}),
            "snapshot.interval_ms: expected an integer, got float",
        ),
        (lambda d: d.update(snapshot={"timeout_s": -1}), "snapshot.timeout_s: must be positive"),
        (lambda d: d.update(snapshot={"cache_size": 0}), "snapshot.cache_size: must be positive"),
        (
            lambda d: d.update(snapshot={"sweep_intervals": 0}),
            "snapshot.sweep_intervals: must be positive",
        ),
        (lambda d: d.update(snapshot=[1]), "snapshot: expected a mapping, got list"),
        (lambda d: d.update(lease={"bucket": "a.b"}), "lease.bucket: invalid KV bucket name 'a.b'"),
        (lambda d: d.update(lease={"ttl_s": 0}), "lease.ttl_s: must be positive"),
        (lambda d: d.update(grpc={"listen": "7070"}), "grpc.listen: invalid listen address '7070'"),
        (
            lambda d: d.update(grpc={"listen": "::1:7070"}),
            "grpc.listen: invalid listen address '::1:7070': write IPv6",
        ),
        (
            lambda d: d.update(http={"listen": "0.0.0.0:80800"}),
            "http.listen: invalid listen address '0.0.0.0:80800': port",
        ),
        (
            lambda d: d.update(log={"format": "xml"}),
            "log.format: must be one of auto, json, console; got 'xml'",
        ),
        (lambda d: d.update(log={"level": "loud"}), "log.level: must be one of debug, info"),
        (
            lambda d: d["nats"].update(user="u"),
            "nats.password: user and password must be set together",
        ),
        (
            lambda d: d["nats"].update(token="t", user="u", password="p"),
            "nats.token: choose one authentication method, got user/password and token",
        ),
        (
            lambda d: d["nats"].update(tls={"cert_file": __file__}),
            "nats.tls.key_file: cert_file and key_file must be set together",
        ),
        (
            lambda d: d["nats"].update(tls={"ca_file": "/nonexistent/ca.pem"}),
            "nats.tls.ca_file: file not found: /nonexistent/ca.pem",
        ),
        (
            lambda d: d["nats"].update(creds_file="/nonexistent/u.creds"),
            "nats.creds_file: file not found",
        ),
        (
            lambda d: d.update(grpc={"tls": {"client_ca_file": __file__}}),
            "grpc.tls.client_ca_file: client certificates need server TLS",
        ),
    ],
)
def test_each_error_names_its_key(change: Any, expected: str) -> None:
    data = minimal()
    change(data)
    problems = problems_of(data)
    assert any(p.startswith(expected) for p in problems), problems


def test_all_problems_are_listed_at_once() -> None:
    data = minimal()
    data["region"] = "north"
    data["snapshot"] = {"interval_ms": -5, "cache_size": "x"}
    data["grpc"] = {"listen": "nope"}
    data["extra"] = 1
    problems = problems_of(data, {"RSUB_SNAPSHOT__INTERVAL": "1", "RSUB_NOPE": "1"})
    keys = sorted(p.split(":")[0] for p in problems)
    assert keys == sorted(
        [
            "RSUB_SNAPSHOT__INTERVAL",
            "extra",
            "region",
            "snapshot.interval_ms",
            "snapshot.cache_size",
            "grpc.listen",
        ]
    )


def test_env_overrides_are_typed() -> None:
    env = {
        "RSUB_REGION": "east",
        "RSUB_NATS__SERVERS": "nats://a:4222, nats://b:4222",
        "RSUB_NATS__USER": "svc",
        "RSUB_NATS__PASSWORD": "s3cret",
        "RSUB_NATS__CONNECT_TIMEOUT_S": "2.5",
        "RSUB_SNAPSHOT__INTERVAL_MS": "500",
        "RSUB_PROGRESS__ENABLED": "false",
        "RSUB_STREAMS": "[{name: orders}, {name: pay, replicas: 3}]",
        "RSUB_CLUSTER_FOR_REGION": "{east: c-east}",
        "RSUB_LOG__FORMAT": "json",
        "HOME": "/root",  # not ours: ignored
    }
    config = config_from_mapping(minimal(), env)
    assert config.region == "east"
    assert config.nats.servers == ("nats://a:4222", "nats://b:4222")
    assert config.nats.user == "svc"
    assert config.nats.password == Secret("s3cret")
    assert config.nats.connect_timeout_s == 2.5
    assert config.snapshot.interval_ms == 500
    assert not config.progress.enabled
    assert [(s.name, s.replicas) for s in config.streams] == [("orders", 1), ("pay", 3)]
    assert config.cluster_for("east") == "c-east"
    assert config.log.format == "json"


def test_env_empty_value_clears_an_optional_key() -> None:
    data = minimal()
    data["nats"]["token"] = "from-file"
    config = config_from_mapping(data, {"RSUB_NATS__TOKEN": ""})
    assert config.nats.token is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"RSUB_SNAPSHOT__INTERVAL_MS": "1s"},
            "snapshot.interval_ms: expected an integer, got '1s' (from RSUB_SNAPSHOT__INTERVAL_MS)",
        ),
        (
            {"RSUB_LEASE__TTL_S": "ten"},
            "lease.ttl_s: expected a number, got 'ten' (from RSUB_LEASE__TTL_S)",
        ),
        (
            {"RSUB_SNAPSHOT__INTERVAL_MS": "-1"},
            "snapshot.interval_ms: must be positive, got -1 (from RSUB_SNAPSHOT__INTERVAL_MS)",
        ),
        (
            {"RSUB_REGION": "mars"},
            "region: 'mars' is not in regions ['west', 'central', 'east'] (from RSUB_REGION)",
        ),
        (
            {"RSUB_NATS__SERVERS": "nats://a:1,,nats://b:2"},
            "nats.servers: empty item in comma-separated list",
        ),
        (
            {"RSUB_REGOIN": "east"},
            "RSUB_REGOIN: unknown setting: no key 'regoin' (did you mean RSUB_REGION?)",
        ),
        (
            {"RSUB_NATS_SERVERS": "nats://a:1"},
            "RSUB_NATS_SERVERS: unknown setting: no key 'nats_servers' (did you mean RSUB_NATS__SERVERS?)",
        ),
        (
            {"RSUB_NATS_TLS__CA_FILE": "/ca.pem"},
            "RSUB_NATS_TLS__CA_FILE: unknown setting: no key 'nats_tls' (did you mean RSUB_NATS__TLS__CA_FILE?)",
        ),
        (
            {"RSUB_LOG_LVL": "debug"},
            "RSUB_LOG_LVL: unknown setting: no key 'log_lvl' (did you mean RSUB_LOG__LEVEL?)",
        ),
        ({"RSUB_GRPC__PORT": "7070"}, "RSUB_GRPC__PORT: unknown setting: no key 'grpc.port'"),
        (
            {"RSUB_LEASE_BUCKET": "b"},
            "RSUB_LEASE_BUCKET: unknown setting: no key 'lease_bucket' (did you mean RSUB_LEASE__BUCKET?)",
        ),
        (
            {"RSUB_NATS__SERVER": "x"},
            "RSUB_NATS__SERVER: unknown setting: no key 'nats.server' (did you mean RSUB_NATS__SERVERS?)",
        ),
        ({"RSUB_REGION__X": "x"}, "RSUB_REGION__X: unknown setting: region has no sub-keys"),
        ({"RSUB_NATS": "x"}, "RSUB_NATS: nats is a section; set its keys as RSUB_NATS__<KEY>"),
        ({"RSUB_STREAMS": "[{name: a"}, "streams: not valid YAML"),
        (
            {"RSUB_STREAMS": "[{name: a, size: 1}]"},
            "streams[0].size: unknown key (from RSUB_STREAMS)",
        ),
    ],
)
def test_env_errors_name_the_variable_or_key(env: dict[str, str], expected: str) -> None:
    problems = problems_of(minimal(), env)
    assert any(p.startswith(expected) for p in problems), problems


def test_secrets_never_shown() -> None:
    data = minimal()
    data["nats"].update(user="svc", password="hunter2-pw")
    data["grpc"] = {"auth_token": "hunter2-grpc"}
    config = config_from_mapping(data, {"RSUB_NATS__PASSWORD": "hunter2-env"})
    assert config.nats.password is not None and config.nats.password.reveal() == "hunter2-env"
    assert config.grpc.auth_token is not None
    assert config.grpc.auth_token.reveal() == "hunter2-grpc"
    for text in (repr(config), str(config), f"{config.nats.password}", repr(config.grpc)):
        assert "hunter2" not in text
    # A wrongly typed secret is reported without echoing it.
    data["grpc"] = {"auth_token": 123456789}
    problems = problems_of(data)
    assert "grpc.auth_token: expected a string, got int" in problems
    assert "123456789" not in "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nats://svc:pw@h:4222", "nats://***@h:4222"),
        ("nats://svc:p@ss/w@h:4222", "nats://***@h:4222"),  # raw '@' and '/' in the password
        ("svc:pw@h:4222", "***@h:4222"),  # nats-py accepts URLs without a scheme
        ("nats://a:b@h1,tls://c:d@h2", "nats://***@h1,tls://***@h2"),
        ("['nats://a:b@h1', '[ws://c@h2]']", "['nats://***@h1', '[ws://***@h2]']"),
        ("nats://h1:4222,nats://h2", "nats://h1:4222,nats://h2"),
    ],
)
def test_hide_userinfo(text: str, shown: str) -> None:
    assert hide_userinfo(text) == shown


def test_a_server_url_with_a_password_is_never_echoed() -> None:
    data = minimal()
    data["nats"]["servers"] = ["nats://svc:hunter2-url@127.0.0.1:42x"]
    problems = problems_of(data, {"RSUB_GRPC__LISTEN": "nats://svc:hunter2-env@h"})
    assert "nats.servers: invalid server URL(s) ['nats://***@127.0.0.1:42x']" in problems[0]
    assert "hunter2" not in "\n".join(problems)


def test_a_server_url_password_never_shows_in_a_config_repr() -> None:
    data = minimal()
    data["nats"]["servers"] = ["nats://svc:hunter2-url@127.0.0.1:4222", "tls://tok-hunter2@h2"]
    data["nats"]["user"] = "alice"
    data["nats"]["password"] = "hunter2-pw"
    config = config_from_mapping(data)
    assert config.nats.servers[0] == "nats://svc:hunter2-url@127.0.0.1:4222"  # kept as given
    for text in (repr(config), str(config), repr(config.nats), str(config.nats)):
        assert "hunter2" not in text
        assert "servers=('nats://***@127.0.0.1:4222', 'tls://***@h2')" in text
        assert "user='alice'" in text
    # The repr is still the dataclass's, field by field.
    assert repr(config).startswith("Config(region='west', regions=('west', 'central', 'east')")


def test_secrets_not_in_logs() -> None:
    import io
    import json

    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("json", "info", stream=out)
    try:
        data = minimal()
        data["nats"]["token"] = "hunter2-token"
        config = config_from_mapping(data)
        structlog.get_logger("test").info("config_loaded", config=config, nats=config.nats)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()
        logging.captureWarnings(False)
    line = json.loads(out.getvalue().strip())
    assert line["event"] == "config_loaded"
    assert "Secret('***')" in line["nats"]
    assert "hunter2" not in out.getvalue()


def test_load_config_from_yaml_file_with_env(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "region: west\n"
        "regions: [west, east]\n"
        "nats:\n  servers: ['nats://n1:4222']\n"
        "streams:\n  - name: orders\n    replicas: 3\n"
        "snapshot: {interval_ms: 250}\n"
    )
    config = load_config(path, {"RSUB_REGION": "east"})
    assert config.region == "east"
    assert config.streams[0].replicas == 3
    assert config.snapshot.interval_ms == 250


def test_load_config_without_file_uses_env_only() -> None:
    env = {
        "RSUB_REGION": "west",
        "RSUB_REGIONS": "west,east",
        "RSUB_NATS__SERVERS": "nats://n1:4222",
        "RSUB_STREAMS": "[{name: orders}]",
    }
    assert load_config(None, env).regions == ("west", "east")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("region: [west\n", "<file>: not valid YAML"),
        ("- a\n- b\n", "<file>: top level must be a mapping, got list"),
        ("", "region: missing required key"),
    ],
)
def test_load_config_file_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(path) in str(info.value)
    assert info.value.problems[0].startswith(expected)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # Found by `python -m tests.fuzz config`: it was a UnicodeDecodeError traceback.
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"region: w\xe9st\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert info.value.problems == ["<file>: not UTF-8 text: byte 0xe9 at 9"]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="<file>: cannot read"):
        load_config(tmp_path / "absent.yaml", {})


def test_tls_files_that_exist_are_accepted(tmp_path: Path) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    data = minimal()
    data["nats"]["tls"] = {
        "ca_file": str(tmp_path / "ca.pem"),
        "cert_file": str(tmp_path / "cert.pem"),
        "key_file": str(tmp_path / "key.pem"),
    }
    config = config_from_mapping(data)
    assert config.nats.tls.enabled
    assert config.nats.tls.key_file == tmp_path / "key.pem"


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:7070", ("127.0.0.1", 7070)),
        ("[::]:0", ("::", 0)),
        ("sidecar:8080", ("sidecar", 8080)),
    ],
)
def test_split_host_port(listen: str, expected: tuple[str, int]) -> None:
    assert split_host_port(listen) == expected
