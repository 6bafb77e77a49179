"""One model of how to connect to NATS (`sidecar.config.nats`): the sidecar's configuration
file, `rsub topology apply`'s flags and the Spark source's options refuse the same bad
settings with the same problem, each naming the key its own way (issue 20)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.cli import build_parser
from sidecar.cli.topology import NATS_FLAGS, nats_config
from sidecar.config.checks import ConfigError
from sidecar.config.loading import config_from_mapping
from sidecar.config.nats import NatsConfig, NatsTlsConfig
from sidecar.config.secrets import Secret
from spark_jobs.rsub_spark.options import NATS_OPTIONS, RsubOptionError, parse_options

# Each front end's spelling of the settings (`servers` and the files are set per case).
SPARK = {"servers": "servers", "user": "user", "password": "password", "token": "token"}
SPARK |= {"creds_file": "credsFile", "ca_file": "tlsCa", "cert_file": "tlsCert"}
SPARK |= {"key_file": "tlsKey"}
FLAGS = {key: f"--{name}" for key, name in (("creds_file", "creds"), ("ca_file", "tls-ca"))}
FLAGS |= {"servers": "--servers", "user": "--user", "password": "--password"}
FLAGS |= {"token": "--token", "cert_file": "--tls-cert", "key_file": "--tls-key"}
TLS_KEYS = ("ca_file", "cert_file", "key_file")

Problems = list[tuple[str, str]]
"""(the settings' key path, problem), in the order given."""

CASES: dict[str, tuple[dict[str, str], Problems]] = {
    "user without password": (
        {"user": "app"},
        [("password", "user and password must be set together")],
    ),
    "password without user": (
        {"password": "pw"},
        [("user", "user and password must be set together")],
    ),
    "user and token": (
        {"user": "app", "password": "pw", "token": "tok"},
        [("token", "choose one authentication method, got user/password and token")],
    ),
    "token and creds": (
        {"token": "tok", "creds_file": "{creds}"},
        [("token", "choose one authentication method, got token and creds_file")],
    ),
    "creds file missing": (
        {"creds_file": "{missing}"},
        [("creds_file", "file not found: {missing}")],
    ),
    "certificate without key": (
        {"cert_file": "{creds}"},
        [("tls.key_file", "cert_file and key_file must be set together")],
    ),
    "CA missing and bad URL": (
        {"servers": "http://h:4222", "ca_file": "{missing}"},
        [
            ("tls.ca_file", "file not found: {missing}"),
            (
                "servers",
                "invalid server URL(s) ['http://h:4222']: expected nats://host[:port] "
                "(or tls, ws, wss)",
            ),
        ],
    ),
}


def _fill(text: str, tmp: Path) -> str:
    return text.format(creds=tmp / "app.creds", missing=tmp / "missing.pem")


def _from_file(given: dict[str, str]) -> Problems:
    nats: dict[str, object] = {"servers": [given.get("servers", "nats://h:4222")]}
    for key in ("user", "password", "token", "creds_file"):
        if key in given:
            nats[key] = given[key]
    tls = {key: given[key] for key in TLS_KEYS if key in given}
    if tls:
        nats["tls"] = tls
    data = {"region": "west", "regions": ["west"], "streams": [{"name": "o"}], "nats": nats}
    with pytest.raises(ConfigError) as err:
        config_from_mapping(data)
    return [(key.removeprefix("nats."), problem) for key, problem in err.value.keyed]


def _lines(error: Exception, names: dict[str, str]) -> Problems:
    """`key: problem` lines back to the settings' key paths."""
    keys = {name: key for key, name in names.items()}
    return [
        (keys[name], problem)
        for name, _, problem in (line.partition(": ") for line in str(error).splitlines())
    ]


def _from_spark(given: dict[str, str]) -> Problems:
    options = {"stream": "o", "region": "west", "servers": "nats://h:4222"}
    options |= {SPARK[key]: value for key, value in given.items()}
    with pytest.raises(RsubOptionError) as err:
        parse_options(options)
    return _lines(err.value, NATS_OPTIONS)


def _from_flags(given: dict[str, str]) -> Problems:
    argv = ["topology", "apply", "--regions", "west", "--stream", "o"]
    argv += ["--servers", "nats://h:4222"]
    for key, value in given.items():
        argv += [FLAGS[key], value]
    args = build_parser().parse_args(argv)
    with pytest.raises(ValueError) as err:
        nats_config(args, env={})
    return _lines(err.value, NATS_FLAGS)


FRONT_ENDS: dict[str, Callable[[dict[str, str]], Problems]] = {
    "configuration file": _from_file,
    "spark options": _from_spark,
    "topology flags": _from_flags,
}


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("case", CASES)
def test_every_front_end_refuses_the_same_settings_alike(
    case: str, front_end: str, tmp_path: Path
) -> None:
    (tmp_path / "app.creds").write_text("-----BEGIN NATS USER JWT-----\n")
    given, expected = CASES[case]
    filled = {key: _fill(value, tmp_path) for key, value in given.items()}
    problems = FRONT_ENDS[front_end](filled)
    assert sorted(problems) == sorted((key, _fill(p, tmp_path)) for key, p in expected)


def test_settings_built_in_code_check_themselves(tmp_path: Path) -> None:
    """No front end can skip the checks: the model runs them wherever it is built."""
    with pytest.raises(ConfigError, match="token: choose one authentication method"):
        NatsConfig(servers=("nats://h:4222",), token=Secret("t"), user="u", password=Secret("p"))
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="key_file: cert_file and key_file must be set"):
        NatsTlsConfig(cert_file=cert)
    with pytest.raises(ConfigError, match="connect_timeout_s: must be positive"):
        NatsConfig(servers=("nats://h:4222",), connect_timeout_s=0)


def test_no_secret_in_the_problems(tmp_path: Path) -> None:
    with pytest.raises(RsubOptionError) as err:
        parse_options(
            {
                "stream": "o",
                "region": "west",
                "servers": "nats://svc:url-s3cret@h:4222",
                "token": "tok-s3cret",
                "user": "u",
                "password": "pw-s3cret",
            }
        )
    assert "s3cret" not in str(err.value)
